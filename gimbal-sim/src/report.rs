//! Renders `docs/qos-simulation.md`: tables of every experiment, the
//! paper's claims next to our numbers, and the issue's bar.

use std::fmt::Write as _;

use qos_core::sim::experiments::{
    BarCheck, DeviceState, DynamicRun, Experiment, Scale, SchedulerMetrics, SuiteResult,
};
use qos_core::sim::metrics::LatencySummary;
use qos_core::sim::schedulers::SchedulerKind;
use qos_core::IoKind;

use super::plots::Image;

fn mbps(bytes_per_sec: f64) -> String {
    format!("{:.0}", bytes_per_sec / 1e6)
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn lat3(l: &LatencySummary) -> String {
    if l.count == 0 {
        "–".into()
    } else {
        format!("{} / {} / {}", us(l.p50_us), us(l.p99_us), us(l.p999_us))
    }
}

fn image(out: &mut String, images: &[Image], key: &str, alt: &str) {
    if let Some(i) = images.iter().find(|i| i.key == key) {
        let _ = writeln!(out, "\n![{alt}](qos-simulation/{})\n", i.file);
    }
}

fn find<'a>(list: &'a [Experiment], id: &str) -> Option<&'a Experiment> {
    list.iter().find(|e| e.id == id)
}

fn metric(e: Option<&Experiment>, kind: SchedulerKind) -> Option<&SchedulerMetrics> {
    e.and_then(|e| e.of(kind))
}

/// "yes" when ours points the same way as the paper's factor and is at
/// least half of it, "direction only" when it points the same way but is
/// smaller, "no" when it points the other way. Factors are "how many times
/// better Gimbal is" (> 1 means better).
fn verdict_factor(paper: f64, ours: f64) -> &'static str {
    if !ours.is_finite() {
        "n/a"
    } else if ours <= 1.0 {
        "no"
    } else if ours >= paper / 2.0 {
        "yes"
    } else {
        "direction only"
    }
}

struct Claim {
    section: &'static str,
    claim: String,
    paper: String,
    ours: String,
    verdict: String,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

fn group_dev(m: Option<&SchedulerMetrics>, group: usize) -> f64 {
    m.and_then(|m| m.groups.get(group))
        .map_or(f64::NAN, |g| g.deviation)
}

fn group_bw(m: Option<&SchedulerMetrics>, group: usize) -> f64 {
    m.and_then(|m| m.groups.get(group))
        .map_or(f64::NAN, |g| g.bandwidth_per_worker_bytes_per_sec)
}

fn group_f(m: Option<&SchedulerMetrics>, group: usize) -> f64 {
    m.and_then(|m| m.groups.get(group))
        .map_or(f64::NAN, |g| g.f_util_mean)
}

fn claims(suite: &SuiteResult) -> Vec<Claim> {
    use SchedulerKind::*;
    let mut out = Vec::new();
    let util = &suite.utilization;
    let fair = &suite.fairness;
    let bw = |id: &str, k| {
        metric(find(util, id), k).map_or(f64::NAN, |m| m.total_bandwidth_bytes_per_sec)
    };

    // §5.2
    let cases = [
        "utilization-clean-read",
        "utilization-clean-write",
        "utilization-fragmented-read",
        "utilization-fragmented-write",
    ];
    let vs_flashfq: Vec<f64> = cases
        .iter()
        .map(|c| ratio(bw(c, Gimbal), bw(c, FlashFq)))
        .collect();
    let similar = vs_flashfq.iter().all(|r| (0.85..=1.15).contains(r));
    out.push(Claim {
        section: "§5.2",
        claim: "Gimbal's utilization is similar to FlashFQ's on both devices".into(),
        paper: "similar".into(),
        ours: format!(
            "Gimbal / FlashFQ bandwidth: C-R {:.2}, C-W {:.2}, F-R {:.2}, F-W {:.2}",
            vs_flashfq[0], vs_flashfq[1], vs_flashfq[2], vs_flashfq[3]
        ),
        verdict: if similar { "yes" } else { "partly" }.into(),
    });
    for (case, name, paper) in [
        ("utilization-clean-read", "read", 2.4),
        ("utilization-clean-write", "write", 6.6),
    ] {
        let r = ratio(bw(case, Gimbal), bw(case, Reflex));
        out.push(Claim {
            section: "§5.2",
            claim: format!("Gimbal outperforms ReFlex on Clean-SSD ({name})"),
            paper: format!("×{paper}"),
            ours: format!("×{r:.1}"),
            verdict: verdict_factor(paper, r).into(),
        });
    }
    let r = ratio(
        bw("utilization-fragmented-read", Gimbal),
        bw("utilization-fragmented-read", Parda),
    );
    out.push(Claim {
        section: "§5.2",
        claim: "Gimbal outperforms Parda on Fragment-SSD 4 KiB reads (Parda's end-to-end loop cannot find the capacity)".into(),
        paper: "×2.6".into(),
        ours: format!("×{r:.2}"),
        verdict: verdict_factor(2.6, r).into(),
    });
    let fw = find(util, "utilization-fragmented-write");
    let wl = |k| metric(fw, k).map_or(f64::NAN, |m| m.write_latency.mean_us);
    let vs_parda = ratio(wl(Gimbal), wl(Parda));
    let vs_others = (ratio(wl(Reflex), wl(Gimbal)) + ratio(wl(FlashFq), wl(Gimbal))) / 2.0;
    out.push(Claim {
        section: "§5.2",
        claim: "Fragment-SSD writes: Gimbal's mean latency is above Parda's but far below ReFlex's and FlashFQ's".into(),
        paper: "Parda ×3.4 lower; others ×9 higher".into(),
        ours: format!("Parda ×{vs_parda:.1} lower; others ×{vs_others:.1} higher"),
        verdict: if vs_others > 1.0 {
            verdict_factor(9.0, vs_others).into()
        } else {
            "no".into()
        },
    });

    // §5.3 sizes
    let sizes = find(fair, "fairness-sizes-clean");
    let g = metric(sizes, Gimbal);
    for (group, label, papers) in [
        (1usize, "128 KiB", [2.1, 8.7, 6.4]),
        (0, "4 KiB", [1.9, 4.1, 7.1]),
    ] {
        let mine: Vec<f64> = [Reflex, FlashFq, Parda]
            .iter()
            .map(|&k| ratio(group_dev(metric(sizes, k), group), group_dev(g, group)))
            .collect();
        let worst = mine
            .iter()
            .zip(papers)
            .map(|(&m, p)| verdict_factor(p, m))
            .max_by_key(|v| match *v {
                "no" => 3,
                "direction only" => 2,
                "n/a" => 1,
                _ => 0,
            })
            .unwrap_or("n/a");
        out.push(Claim {
            section: "§5.3",
            claim: format!("Different sizes: Gimbal's deviation for {label} readers is lower than ReFlex's / FlashFQ's / Parda's"),
            paper: format!("×{} / ×{} / ×{}", papers[0], papers[1], papers[2]),
            ours: format!("×{:.1} / ×{:.1} / ×{:.1}", mine[0], mine[1], mine[2]),
            verdict: worst.into(),
        });
    }
    let more = ratio(group_bw(g, 1), group_bw(g, 0)) - 1.0;
    out.push(Claim {
        section: "§5.3",
        claim: "Different sizes: Gimbal gives a 128 KiB reader more bandwidth than a 4 KiB reader"
            .into(),
        paper: "+22.0 %".into(),
        ours: format!("{:+.1} %", more * 100.0),
        verdict: if more > 0.11 && more < 0.44 {
            "yes"
        } else if more > 0.0 {
            "direction only"
        } else {
            "no"
        }
        .into(),
    });
    let reflex_same = ratio(
        group_bw(metric(sizes, Reflex), 1),
        group_bw(metric(sizes, Reflex), 0),
    );
    out.push(Claim {
        section: "§5.3",
        claim: "Different sizes: ReFlex (cost ∝ size) gives both sizes the same bandwidth".into(),
        paper: "same".into(),
        ours: format!("128 KiB / 4 KiB per worker = {reflex_same:.2}"),
        verdict: if (0.9..=1.1).contains(&reflex_same) {
            "yes"
        } else {
            "no"
        }
        .into(),
    });

    // §5.3 types
    for (id, device, paper_diff, papers) in [
        (
            "fairness-types-clean",
            "Clean-SSD",
            13.8f64,
            [12.8, 10.4, 7.5],
        ),
        (
            "fairness-types-fragmented",
            "Fragment-SSD",
            3.8,
            [4.2, 184.2, 330.2],
        ),
    ] {
        let e = find(fair, id);
        let g = metric(e, Gimbal);
        let diff = (ratio(group_f(g, 0), group_f(g, 1)) - 1.0).abs() * 100.0;
        out.push(Claim {
            section: "§5.3",
            claim: format!("Different types, {device}: Gimbal's read and write f-Util are close"),
            paper: format!("{paper_diff} % apart"),
            ours: format!(
                "{diff:.1} % apart (read {:.2}, write {:.2})",
                group_f(g, 0),
                group_f(g, 1)
            ),
            verdict: if diff <= (2.0 * paper_diff).max(10.0) {
                "yes"
            } else if diff < 50.0 {
                "partly"
            } else {
                "no"
            }
            .into(),
        });
        let gd = g.map_or(f64::NAN, |m| m.f_util_deviation);
        let mine: Vec<f64> = [Reflex, FlashFq, Parda]
            .iter()
            .map(|&k| ratio(metric(e, k).map_or(f64::NAN, |m| m.f_util_deviation), gd))
            .collect();
        let verdicts: Vec<&str> = mine
            .iter()
            .zip(papers)
            .map(|(&m, p)| verdict_factor(p, m))
            .collect();
        out.push(Claim {
            section: "§5.3",
            claim: format!("Different types, {device}: Gimbal's deviation is lower than ReFlex's / FlashFQ's / Parda's"),
            paper: format!("×{} / ×{} / ×{}", papers[0], papers[1], papers[2]),
            ours: format!("×{:.1} / ×{:.1} / ×{:.1}", mine[0], mine[1], mine[2]),
            verdict: verdicts.join(" / "),
        });
        let f = metric(e, FlashFq);
        let same = ratio(group_bw(f, 0), group_bw(f, 1));
        out.push(Claim {
            section: "§5.3",
            claim: format!("Different types, {device}: FlashFQ's linear model gives readers and writers the same bandwidth"),
            paper: "same".into(),
            ours: format!("read / write per worker = {same:.2}"),
            verdict: if (0.8..=1.25).contains(&same) { "yes" } else { "no" }.into(),
        });
    }
    let clean_types = find(fair, "fairness-types-clean");
    let reflex_w = group_f(metric(clean_types, Reflex), 1);
    out.push(Claim {
        section: "§5.3",
        claim: "ReFlex's fixed (fragmented-device) model limits writes substantially on Clean-SSD"
            .into(),
        paper: "substantially".into(),
        ours: format!("ReFlex writers' f-Util {reflex_w:.2}"),
        verdict: if reflex_w < 0.5 { "yes" } else { "no" }.into(),
    });

    // §5.4
    for (id, device, paper_read, paper_write) in [
        ("fairness-types-clean", "Clean-SSD", 48.6, 57.1),
        ("fairness-types-fragmented", "Fragment-SSD", 57.5, 62.6),
    ] {
        let e = find(fair, id);
        let cut = |kind: IoKind| {
            let pick = |m: Option<&SchedulerMetrics>| {
                m.map_or(f64::NAN, |m| match kind {
                    IoKind::Read => m.read_latency.p99_us,
                    IoKind::Write => m.write_latency.p99_us,
                })
            };
            (1.0 - ratio(pick(metric(e, Gimbal)), pick(metric(e, Parda)))) * 100.0
        };
        let (r, w) = (cut(IoKind::Read), cut(IoKind::Write));
        let verdict = |paper: f64, ours: f64| {
            if ours >= paper / 2.0 {
                "yes"
            } else if ours > 0.0 {
                "direction only"
            } else {
                "no"
            }
        };
        out.push(Claim {
            section: "§5.4",
            claim: format!("{device}: Gimbal's p99 read / write latency is below Parda's"),
            paper: format!("−{paper_read} % / −{paper_write} %"),
            ours: format!("{:+.1} % / {:+.1} %", -r, -w),
            verdict: format!("{} / {}", verdict(paper_read, r), verdict(paper_write, w)),
        });
        let beats = [Reflex, FlashFq].iter().all(|&k| {
            let (g, o) = (metric(e, Gimbal), metric(e, k));
            match (g, o) {
                (Some(g), Some(o)) => {
                    g.read_latency.p99_us < o.read_latency.p99_us
                        && g.write_latency.p99_us < o.write_latency.p99_us
                }
                _ => false,
            }
        });
        out.push(Claim {
            section: "§5.4",
            claim: format!("{device}: ReFlex and FlashFQ (no flow control) have higher tail latency than Gimbal"),
            paper: "higher".into(),
            ours: if beats { "higher for reads and writes" } else { "not for every kind" }.into(),
            verdict: if beats { "yes" } else { "no" }.into(),
        });
    }

    // §5.5
    if let Some(run) = suite.dynamic.as_ref().and_then(|d| {
        d.runs
            .iter()
            .find(|r| r.scheduler == Gimbal && r.device == DeviceState::Clean)
    }) {
        let interval = suite.dynamic.as_ref().map_or(1, |d| d.interval_ns);
        let phases = phase_summaries(run, interval);
        if let (Some(one), Some(eight)) = (phases.get(1), phases.get(8)) {
            let jump = phases
                .iter()
                .skip(1)
                .take(8)
                .map(|p| p.write_latency_us)
                .fold(0.0f64, f64::max)
                / one.write_latency_us.max(1.0);
            out.push(Claim {
                section: "§5.5",
                claim: "One writer beside 8 readers is absorbed by the write buffer: latency below Thresh_min, write cost 1".into(),
                paper: "≈ 70 µs, cost 1".into(),
                ours: format!(
                    "{} device latency, cost {:.1}",
                    us(one.write_latency_us),
                    one.write_cost
                ),
                verdict: if one.write_latency_us < 250.0 && one.write_cost < 1.5 {
                    "yes"
                } else {
                    "no"
                }
                .into(),
            });
            out.push(Claim {
                section: "§5.5",
                claim: "More writers exceed the buffer: write latency grows more than tenfold and the write cost rises".into(),
                paper: "> ×10".into(),
                ours: format!("×{jump:.0}, cost up to {:.1}", phases.iter().map(|p| p.write_cost).fold(0.0, f64::max)),
                verdict: if jump >= 10.0 { "yes" } else if jump > 2.0 { "direction only" } else { "no" }.into(),
            });
            out.push(Claim {
                section: "§5.5",
                claim: "With 8 readers and 8 writers the writers converge to an equal share".into(),
                paper: "fair share".into(),
                ours: format!(
                    "writers {}–{} MB/s each",
                    mbps(eight.writer_min_bps),
                    mbps(eight.writer_max_bps)
                ),
                verdict: if eight.writer_min_bps >= 0.8 * eight.writer_max_bps {
                    "yes"
                } else {
                    "no"
                }
                .into(),
            });
        }
    }
    out
}

/// Steady-state averages of one §5.5 phase (the second half of each
/// interval).
struct Phase {
    write_latency_us: f64,
    read_latency_us: f64,
    write_cost: f64,
    read_bps: f64,
    writer_min_bps: f64,
    writer_max_bps: f64,
}

fn phase_summaries(run: &DynamicRun, interval_ns: u64) -> Vec<Phase> {
    let phases = run
        .samples
        .last()
        .map_or(0, |s| (s.at_ns / interval_ns.max(1)) as usize);
    (0..phases)
        .map(|k| {
            let lo = k as u64 * interval_ns + interval_ns / 2;
            let hi = (k as u64 + 1) * interval_ns;
            let samples: Vec<_> = run
                .samples
                .iter()
                .filter(|s| s.at_ns > lo && s.at_ns <= hi)
                .collect();
            let mean = |f: &dyn Fn(&qos_core::sim::engine::Sample) -> Option<f64>| {
                let v: Vec<f64> = samples.iter().filter_map(|s| f(s)).collect();
                if v.is_empty() {
                    f64::NAN
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            };
            let per_worker = |i: usize| mean(&|s| s.worker_bandwidth_bytes_per_sec.get(i).copied());
            let writers: Vec<f64> = (8..16)
                .filter(|&i| i - 8 < k.min(8))
                .map(per_worker)
                .collect();
            Phase {
                write_latency_us: mean(&|s| s.write_device_latency_us),
                read_latency_us: mean(&|s| s.read_device_latency_us),
                write_cost: mean(&|s| s.write_cost),
                read_bps: (0..8).map(per_worker).sum(),
                writer_min_bps: writers.iter().copied().fold(f64::INFINITY, f64::min),
                writer_max_bps: writers.iter().copied().fold(0.0, f64::max),
            }
        })
        .collect()
}

fn scale_text(scale: Scale) -> &'static str {
    match scale {
        Scale::Tiny => "tiny (plumbing test only: nothing has converged)",
        Scale::Quick => "quick (300 ms warm-up, 100 ms measured per run; §5.5 interval 40 ms)",
        Scale::Full => "full (500 ms warm-up, 1 s measured per run; §5.5 interval 0.5 s)",
    }
}

/// The whole report.
pub fn render(suite: &SuiteResult, checks: &[BarCheck], images: &[Image]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# QoS simulation: the Gimbal paper's experiments on a simulated DCT983\n"
    );
    let _ = writeln!(
        o,
        "Generated by `gimbal-sim` (seed {}, scale {}; about {} on two cores in release \
         mode). Do not edit by hand: \
         change the code and regenerate (`cargo run --release -p gimbal-sim`). \
         Every number comes from `qos-core::sim`, a \
         deterministic discrete-event simulation: the same seed gives the same report.\n",
        suite.seed,
        scale_text(suite.scale),
        match suite.scale {
            Scale::Full => "20 s",
            Scale::Quick => "3 s",
            Scale::Tiny => "1 s",
        }
    );
    let _ = writeln!(o, "## What is simulated\n");
    let _ = writeln!(
        o,
        "- **Clients**: closed-loop workers like fio jobs (§5.1: 128 KiB workers keep 4 I/Os \
         outstanding, 4 KiB workers 32; reads random, 128 KiB writes sequential, 4 KiB writes random), \
         each a tenant, 10 µs one-way network plus 100 Gb/s transfer.\n\
         - **Device**: `qos_core::ssd_model`, calibrated to the paper's Samsung DCT983 (32 dies, 16 KiB \
         senses, a 3.2 GB/s host link, a 1 MiB write buffer flushed in suspendable slices with reads first, \
         garbage collection whose write amplification grows with fragmentation: 1 clean, 5 fragmented). \
         Its module documentation has the calibration table; the measured standalone maxima are below.\n\
         - **Schemes** (§5.1), each calibrated from the device model the way the original derives its \
         parameters from a real device (see `qos_core::sim::schedulers`): FIFO (a plain target), \
         ReFlex (static cost model profiled on the fragmented device, DRR, token pacing), Parda (client \
         windows driven by end-to-end latency, FIFO target), FlashFQ (SFQ(D) with a linear cost model), \
         Gimbal (`qos_core::switch::GimbalSwitch` with the §4.2 parameters and clients honouring the \
         credits in completion dword 1, Algorithm 3).\n\
         - **Metrics**: f-Util(i) = bw(i) / (standalone_max(i) / N) over all N workers (§5.1); a group's \
         deviation is the mean |f-Util − 1| of its workers, a scheme's deviation the mean over groups; \
         utilization is the mean f-Util (bandwidth over the standalone maximum for identical workers); \
         latency is end to end, from the client sending a request to its completion arriving \
         (time waiting at the client for a credit or window is not included, as in the paper).\n"
    );

    let _ = writeln!(
        o,
        "## Calibration: standalone maxima (16 workers alone, FIFO)\n"
    );
    let _ = writeln!(
        o,
        "| device | workload | bandwidth MB/s | mean latency | paper |"
    );
    let _ = writeln!(o, "|---|---|---:|---:|---|");
    for s in &suite.calibration.standalone {
        let paper = match (s.device, s.workload.as_str()) {
            (_, "4K-rand-read") => "1.6–1.67 GB/s",
            (_, "128K-rand-read") | (_, "128K-seq-read") => "3.16–3.2 GB/s",
            (DeviceState::Fragmented, "4K-rand-write") => "≈ 180 MB/s",
            (DeviceState::Clean, w) if w.contains("write") => {
                "fragmented is 16.9 % of it (≈ 1.06 GB/s)"
            }
            _ => "",
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            s.device.name(),
            s.workload,
            mbps(s.bandwidth_bytes_per_sec),
            us(s.mean_latency_us),
            paper
        );
    }
    let p = &suite.calibration.params;
    let _ = writeln!(
        o,
        "\nDerived parameters: ReFlex {:.0} tokens/s (90 % of the fragmented 4 KiB read IOPS), write \
         cost {:.2} (fragmented read/write IOPS ratio); FlashFQ cost = {:.1} µs + {:.3} ns/byte, \
         dispatch depth {}; Parda L = {} µs, γ = {}, β = {}, period {} ms; Gimbal: §4.2 defaults \
         (Thresh {}–{} µs, α = ½, β = {}, 128 KiB slots, 8 slots, write cost worst {}, δ = {}, 256 KiB \
         buckets), write-cost update every {} ms, starting rate {} GiB/s.\n",
        p.reflex.tokens_per_sec,
        p.reflex.write_cost,
        p.flashfq.cost_fixed_ns / 1000.0,
        p.flashfq.cost_per_byte_ns,
        p.flashfq.dispatch_depth,
        p.parda.latency_target_ns / 1000,
        p.parda.smoothing,
        p.parda.share,
        p.parda.period_ns / 1_000_000,
        p.gimbal.latency_threshold_min_us,
        p.gimbal.latency_threshold_max_us,
        p.gimbal.underutilized_rate_gain,
        p.gimbal.write_cost_worst,
        p.gimbal.write_cost_decrement,
        p.gimbal.write_cost_update_interval_us / 1000,
        p.gimbal.initial_target_rate_bps >> 30
    );

    // §5.2
    let _ = writeln!(o, "## §5.2 Utilization (16 identical workers)\n");
    image(&mut o, images, "utilization", "utilization per scheme");
    let _ = writeln!(
        o,
        "| case | scheme | bandwidth MB/s | utilization | mean latency | p50 / p99 / p99.9 |"
    );
    let _ = writeln!(o, "|---|---|---:|---:|---:|---|");
    for e in &suite.utilization {
        for s in &e.schedulers {
            let l = if s.read_latency.count > 0 {
                &s.read_latency
            } else {
                &s.write_latency
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.2} | {} | {} |",
                e.title,
                s.scheduler.name(),
                mbps(s.total_bandwidth_bytes_per_sec),
                s.utilization,
                us(l.mean_us),
                lat3(l)
            );
        }
    }

    // §5.3
    let _ = writeln!(o, "\n## §5.3 Fairness (f-Util)\n");
    for e in &suite.fairness {
        let _ = writeln!(o, "### {} — {} ({})\n", e.id, e.title, e.device.name());
        image(&mut o, images, &format!("fairness/{}", e.id), &e.id);
        let groups: Vec<String> = e
            .composition
            .iter()
            .map(|(w, n)| format!("{} ×{n}", w.label()))
            .collect();
        let _ = write!(o, "| scheme | total MB/s | utilization | deviation |");
        for g in &groups {
            let _ = write!(
                o,
                " {g}: MB/s per worker | f-Util mean [min–max] | deviation |"
            );
        }
        let _ = writeln!(o);
        let _ = write!(o, "|---|---:|---:|---:|");
        for _ in &groups {
            let _ = write!(o, "---:|---|---:|");
        }
        let _ = writeln!(o);
        for s in &e.schedulers {
            let _ = write!(
                o,
                "| {} | {} | {:.2} | **{:.3}** |",
                s.scheduler.name(),
                mbps(s.total_bandwidth_bytes_per_sec),
                s.utilization,
                s.f_util_deviation
            );
            for g in &s.groups {
                let _ = write!(
                    o,
                    " {} | {:.2} [{:.2}–{:.2}] | {:.3} |",
                    mbps(g.bandwidth_per_worker_bytes_per_sec),
                    g.f_util_mean,
                    g.f_util_min,
                    g.f_util_max,
                    g.deviation
                );
            }
            let _ = writeln!(o);
        }
        let _ = writeln!(o);
    }

    // §5.4
    let _ = writeln!(o, "## §5.4 Latency (end to end; p50 / p99 / p99.9)\n");
    let _ = writeln!(o, "| experiment | scheme | reads | writes |");
    let _ = writeln!(o, "|---|---|---|---|");
    for e in &suite.fairness {
        for s in &e.schedulers {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} |",
                e.id,
                s.scheduler.name(),
                lat3(&s.read_latency),
                lat3(&s.write_latency)
            );
        }
    }
    for e in &suite.fairness {
        image(
            &mut o,
            images,
            &format!("latency/{}", e.id),
            &format!("latency {}", e.id),
        );
    }

    // §5.5
    if let Some(d) = &suite.dynamic {
        let _ = writeln!(o, "## §5.5 Dynamic workload\n");
        let _ = writeln!(
            o,
            "8 readers (4 KiB random, ≤ 200 MB/s each) from the start; a writer (4 KiB random, ≤ 60 MB/s) \
             joins every {} ms up to 8; then a reader leaves every {} ms. The paper uses 5 s intervals and \
             does not say which device state; see `qos_core::sim::experiments::DYNAMIC_RUNS` for why the \
             clean device is the main run. Latency is the device latency measured in the switch, averaged \
             per {} ms as in Fig. 9.\n",
            d.interval_ns / 1_000_000,
            d.interval_ns / 1_000_000,
            d.sample_interval_ns / 1_000_000
        );
        for run in &d.runs {
            let stem =
                format!("{}-{:?}", run.scheduler.name().to_lowercase(), run.device).to_lowercase();
            let _ = writeln!(o, "### {} on {}\n", run.scheduler.name(), run.device.name());
            image(
                &mut o,
                images,
                &format!("dynamic-bandwidth/dynamic-{stem}"),
                "bandwidth over time",
            );
            image(
                &mut o,
                images,
                &format!("dynamic-latency/dynamic-{stem}"),
                "latency over time",
            );
            let phases = phase_summaries(run, d.interval_ns);
            let _ = writeln!(o, "| phase | readers | writers | reads MB/s | writer MB/s (min–max) | read latency | write latency | write cost |");
            let _ = writeln!(o, "|---:|---:|---:|---:|---|---:|---:|---:|");
            for (k, p) in phases.iter().enumerate() {
                let writers = k.min(8);
                let readers = if k <= 8 { 8 } else { 16 - k };
                let cost = if p.write_cost.is_finite() {
                    format!("{:.1}", p.write_cost)
                } else {
                    "–".into()
                };
                let wl = if p.write_latency_us.is_finite() {
                    us(p.write_latency_us)
                } else {
                    "–".into()
                };
                let rl = if p.read_latency_us.is_finite() {
                    us(p.read_latency_us)
                } else {
                    "–".into()
                };
                let wb = if writers > 0 {
                    format!("{}–{}", mbps(p.writer_min_bps), mbps(p.writer_max_bps))
                } else {
                    "–".into()
                };
                let _ = writeln!(
                    o,
                    "| {k} | {readers} | {writers} | {} | {wb} | {rl} | {wl} | {cost} |",
                    mbps(p.read_bps)
                );
            }
            let _ = writeln!(o);
        }
    }

    // Claims
    let _ = writeln!(o, "## The paper's claims, tested\n");
    let _ = writeln!(
        o,
        "Verdicts: **yes** = same direction and at least half the paper's factor; **direction only** = \
         Gimbal is better but by less; **partly** / **no** as written. Factors are how many times \
         lower (better) Gimbal's number is.\n"
    );
    let _ = writeln!(o, "| § | claim | paper | ours | reproduced? |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for c in claims(suite) {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            c.section, c.claim, c.paper, c.ours, c.verdict
        );
    }

    // Bar
    let passed = checks.iter().filter(|c| c.passed).count();
    let _ = writeln!(o, "\n## The issue's bar\n");
    let _ = writeln!(
        o,
        "Gimbal's f-Util deviation the lowest of all schemes in every mixed experiment, its bandwidth \
         within 10 % of the best scheme's in every utilization experiment, its p99 latency (per I/O \
         kind) below FIFO's everywhere. {passed} of {} criteria met.\n",
        checks.len()
    );
    let _ = writeln!(o, "| experiment | criterion | met | numbers |");
    let _ = writeln!(o, "|---|---|---|---|");
    for c in checks {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} |",
            c.experiment,
            c.criterion,
            if c.passed { "yes" } else { "**no**" },
            c.detail
        );
    }
    o.push_str(EXPLANATIONS);
    o
}

/// The analysis of what the numbers mean; kept with the code that
/// produces them so that they change together.
const EXPLANATIONS: &str = r#"
### Where Gimbal misses the bar, and why

- **`fairness-sizes-clean` (4 KiB vs 128 KiB readers): FIFO's deviation is lower.** Gimbal's DRR
  hands every tenant the same cost-weighted bytes per round (one 128 KiB quantum; with 20 tenants
  each holds one virtual slot), so a 128 KiB reader gets about the bandwidth of a 4 KiB reader.
  f-Util, however, asks for twice as much for the 128 KiB reader, whose standalone maximum
  (3.2 GB/s) is twice the 4 KiB one (1.6 GB/s). The paper's own Gimbal has the same limit: it
  reports 22 % more bandwidth for 128 KiB readers, which puts its 128 KiB f-Util near 0.67; ours
  is about 0.63 with +15–20 %. Gimbal beats every scheme the paper compares (ReFlex, Parda,
  FlashFQ). FIFO, which the paper does not compare, lands closer only because of the §5.1 queue
  depths: a 128 KiB worker keeps 512 KiB outstanding against 128 KiB for a 4 KiB worker, and a
  FIFO device shares bandwidth roughly by outstanding bytes. No `qos-core` bug is involved; closing
  the gap would need a size-aware cost in the slot (charging a 128 KiB read less per byte than a
  4 KiB read), which the paper does not have.
- **`fairness-types-fragmented` (4 KiB readers vs writers): ReFlex's deviation (0.10) is lower
  than Gimbal's (≈ 0.12–0.15 at full scale; seeds differ).** ReFlex's static cost model is
  profiled on this very device, and in our model mixing reads with writes costs nearly the sum
  of the parts (5 % writes cut 4 KiB read IOPS by 26 %, against 42.6 % on the real DCT983,
  Appendix A), so a linear model is almost exact and ReFlex's deviation is just the 10 %
  provisioning margin we gave it. Measured separately (seed 7, full scale), ReFlex's deviation on
  this mix is 0.200 / 0.150 / 0.100 / 0.050 / 0.039 at 80 / 85 / 90 / 95 / 100 % provisioning,
  with read and write f-Util within 8 % of each other: in our model a linear cost model is right for
  this device, so any provisioning above ≈ 87 % beats Gimbal. What ReFlex pays instead is latency:
  without flow control its writers' p99 is ≈ 25 ms (Gimbal ≈ 5 ms).
  In the paper the device's super-linear interference breaks ReFlex's model (×4.2 worse than
  Gimbal). Gimbal itself lands at read f-Util ≈ 1.08 and write ≈ 0.83: its write cost converges to
  the worst case (9) while the device's true cost here is 8.8, and a writer's single virtual slot
  holds only 4 writes, so writers are bound by their slot's completion time.

### Claims we do not reproduce, and why

- **Parda** does better here than in the paper (§5.2 F-R utilization, §5.4 tail latency). The
  paper blames Parda's failures on the end-to-end round trip through its SmartNIC testbed being too
  long and noisy for the control loop; our fabric adds a fixed 20 µs, so Parda's latency signal is
  clean and its 10 ms period sees thousands of samples. Parda's windows also hold requests at the
  client, where our end-to-end latency (like the paper's) does not count them, while Gimbal hands
  each 4 KiB reader its whole queue depth as credit (one slot of 32 I/Os), so Gimbal's requests
  wait at the switch instead and that wait is counted. The paper notes the same for Gimbal's reads
  on Fragment-SSD ("the maximum number of outstanding IOs in the workload is the same as the total
  credit count").
- **Read and write f-Util are further apart than the paper's 13.8 % (clean) and 3.8 %
  (fragmented).** Gimbal's write cost rises halfway to `write_cost_worst` = 9 whenever the write
  latency EWMA is above Thresh_min, which is the case whenever the write buffer is saturated. On the
  clean device the true cost of a 128 KiB write is 3.2 (3.2 GB/s reads vs 1.0 GB/s writes), so
  writers are charged nearly three times too much (read f-Util ≈ 1.3, write ≈ 0.85). On the
  fragmented device see above.
- **FlashFQ's and Parda's deviations in the fragmented read/write mix are not as extreme as the
  paper's ×184 and ×330.** On our model the dies serve queued reads before background flushing,
  so readers keep about a fifth of their share even when writers flood the device; the paper's
  device apparently starved them almost completely. The direction holds.

### Changes to `qos-core` this simulation led to

- `write_cost_update_interval_us` default 1 ms → 10 ms. At 1 ms the write cost followed the write
  buffer's fill level (δ = 0.5 per ms takes it from 9 to 1 in 16 ms whenever the buffer has room),
  so writers were alternately flooded with credits and starved; fragmented writers' p99 latency was
  above FIFO's (17.6 ms vs 11.4 ms) and the fragmented read/write mix oscillated. §4.2 asks the cost
  to fall "only when writes are served fast from the SSD (not intermediate low write latency)"; a
  10 ms period does that and still reaches 1 within 160 ms for writes the buffer absorbs (§5.5).
- Simulations start Gimbal's target rate at 8 GiB/s (`gimbal_simulation_config`): the default
  1 GiB/s ramps by e^β per second and needs ~0.3 s to reach 3.2 GB/s, which the paper's long runs
  hide. The default is unchanged.

### Limits of the model

- Interference is die time plus 35 µs per suspension; the real device loses more when reads and
  writes mix (Appendix A: −42.6 % for 5 % writes; model −26 %). This favours static linear models
  (ReFlex) on the fragmented device.
- Gimbal needs a few hundred simulated milliseconds to settle after a burst that overloads it
  (the overloaded state resets the rate to the completion rate, then it grows by e^β per second);
  runs are warmed up 0.5 s (0.3 s quick) before measuring.
- No network contention, one target core, no per-I/O CPU cost (the switch's overhead is measured
  on the real target, not here).
"#;
