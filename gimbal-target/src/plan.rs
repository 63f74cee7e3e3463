//! `gimbal-target plan`: per-class throughput and worst-case latency
//! predicted by qos-core's class model (the ionice paper's Equations 1–3)
//! for given weights and loads, so an operator can choose the Arbitration
//! feature's weights before running anything.
//!
//! Units: with `--mode wrr` rates are commands per second (the weights
//! count commands); with `--mode drr` they are bytes per second (the
//! weights scale the byte quantum, as in the target's vendor-specific
//! arbitration, so only their ratios matter). Equation 3's latency uses
//! the weights as given, i.e. for DRR as if every command were one quantum
//! unit in size.

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use qos_core::class_model::{ClassLoad, HIGH, LOW, MEDIUM};

/// Which arbitration the prediction is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PlanMode {
    /// Weighted round robin: commands.
    Wrr,
    /// Deficit round robin: bytes.
    Drr,
}

/// Arguments of `gimbal-target plan`.
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// Weights of high, medium and low (1's based, as HPW/MPW/LPW + 1).
    #[arg(long, value_name = "H,M,L", default_value = "4,2,1")]
    pub weights: String,
    /// Offered load of a class: `high=RATE`, `medium=RATE` or `low=RATE`,
    /// RATE a number (k, M, G suffixes: x1000) or `max` (backlogged);
    /// repeat or separate with commas. Classes not named offer nothing.
    #[arg(long, value_name = "CLASS=RATE", required = true)]
    pub load: Vec<String>,
    /// Device throughput γ: commands/s (wrr) or bytes/s (drr).
    #[arg(long, value_name = "RATE")]
    pub device: String,
    /// WRR (commands) or DRR (bytes).
    #[arg(long, value_enum, default_value_t = PlanMode::Wrr)]
    pub mode: PlanMode,
    /// Outstanding commands per class, q in Equation 3.
    #[arg(long, default_value_t = 32.0)]
    pub queue_depth: f64,
    /// Commands the device serves in parallel, p in Equation 3.
    #[arg(long, default_value_t = 1.0)]
    pub parallelism: f64,
    /// Mean device latency of one command in µs, a in Equation 3.
    #[arg(long, default_value_t = 100.0)]
    pub latency_us: f64,
}

const NAMES: [&str; 3] = ["high", "medium", "low"];

fn parse_rate(s: &str) -> Result<f64> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("max") {
        return Ok(f64::INFINITY);
    }
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1e3),
        Some((i, 'M')) => (&s[..i], 1e6),
        Some((i, 'G')) => (&s[..i], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .with_context(|| format!("`{s}` is not a rate (a number, k/M/G suffix, or max)"))?;
    if !v.is_finite() || v < 0.0 {
        bail!("rate `{s}` must be a non-negative number");
    }
    Ok(v * mult)
}

/// The model's inputs from the arguments.
pub fn class_load(args: &PlanArgs) -> Result<ClassLoad> {
    let weights: Vec<f64> = args
        .weights
        .split(',')
        .map(|w| {
            let v: u32 = w
                .trim()
                .parse()
                .with_context(|| format!("weight `{w}` is not a whole number"))?;
            if !(1..=256).contains(&v) {
                bail!("weight {v} out of range (1..=256: HPW/MPW/LPW are 8-bit, 0's based)");
            }
            Ok(f64::from(v))
        })
        .collect::<Result<_>>()?;
    let [h, m, l] = weights[..] else {
        bail!("--weights takes three weights: high,medium,low");
    };
    let device = parse_rate(&args.device).context("--device")?;
    if !device.is_finite() || device <= 0.0 {
        bail!("--device must be a positive rate");
    }
    let mut rates = [0.0; 3];
    for item in args.load.iter().flat_map(|l| l.split(',')) {
        let Some((class, rate)) = item.split_once('=') else {
            bail!("--load `{item}`: expected CLASS=RATE");
        };
        let Some(i) = NAMES.iter().position(|n| *n == class.trim()) else {
            bail!("--load `{item}`: class must be high, medium or low (urgent is outside the model: strict priority)");
        };
        rates[i] = parse_rate(rate).with_context(|| format!("--load `{item}`"))?;
    }
    Ok(ClassLoad {
        weights: [h, m, l],
        // A backlogged class: an arrival rate no device reaches.
        arrival_rates: rates.map(|r| if r.is_finite() { r } else { device * 1e6 }),
        device_throughput: device,
    })
}

fn rate(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2}k", v / 1e3)
    } else {
        format!("{v:.1}")
    }
}

/// The report `plan` prints.
pub fn render(args: &PlanArgs) -> Result<String> {
    let model = class_load(args)?;
    let unit = match args.mode {
        PlanMode::Wrr => "commands/s",
        PlanMode::Drr => "bytes/s",
    };
    let rho = model.utilizations();
    let tput = model.throughputs();
    let total: f64 = tput.iter().sum();
    let mut out = String::new();
    let w = model.weights;
    writeln!(
        out,
        "{} arbitration, weights high:medium:low = {}:{}:{}, device {} {unit}",
        match args.mode {
            PlanMode::Wrr => "WRR (commands)",
            PlanMode::Drr => "DRR (bytes)",
        },
        w[0],
        w[1],
        w[2],
        rate(model.device_throughput)
    )?;
    writeln!(
        out,
        "Equation 3 with q = {}, p = {}, a = {} us",
        args.queue_depth, args.parallelism, args.latency_us
    )?;
    writeln!(
        out,
        "{:<7} {:>6} {:>10} {:>6} {:>12} {:>12} {:>6} {:>14}",
        "class", "weight", "load", "rho", "min (Eq.1)", "pred (Eq.2)", "share", "max lat (Eq.3)"
    )?;
    for c in [HIGH, MEDIUM, LOW] {
        let lambda = model.arrival_rates[c];
        let load = if lambda >= model.device_throughput * 1e6 {
            "max".to_string()
        } else {
            rate(lambda)
        };
        let share = if total > 0.0 { tput[c] / total } else { 0.0 };
        let lat = if lambda > 0.0 {
            let us = model.max_latency(c, args.queue_depth, args.parallelism, args.latency_us);
            format!("{us:.0} us")
        } else {
            "-".to_string()
        };
        writeln!(
            out,
            "{:<7} {:>6} {:>10} {:>6.3} {:>12} {:>12} {:>5.1}% {:>14}",
            NAMES[c],
            w[c],
            load,
            rho[c],
            rate(model.min_throughput(c)),
            rate(tput[c]),
            share * 100.0,
            lat
        )?;
    }
    Ok(out)
}

/// Prints the report.
pub fn run(args: &PlanArgs) -> Result<()> {
    print!("{}", render(args)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(weights: &str, load: &[&str], device: &str) -> PlanArgs {
        PlanArgs {
            weights: weights.into(),
            load: load.iter().map(|s| s.to_string()).collect(),
            device: device.into(),
            mode: PlanMode::Wrr,
            queue_depth: 32.0,
            parallelism: 1.0,
            latency_us: 81.0,
        }
    }

    #[test]
    fn backlogged_classes_share_by_weight() {
        let out = render(&args("4,2,1", &["high=max,medium=max,low=max"], "70k")).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("WRR (commands)"), "{out}");
        // 70k x 4/7, 2/7, 1/7; Eq. 3: 32/w x 7 x 81 us.
        assert!(
            lines[3].contains("40.00k") && lines[3].contains("57.1%"),
            "{out}"
        );
        assert!(lines[3].ends_with("4536 us"), "{out}");
        assert!(
            lines[4].contains("20.00k") && lines[4].contains("28.6%"),
            "{out}"
        );
        assert!(
            lines[5].contains("10.00k") && lines[5].contains("14.3%"),
            "{out}"
        );
        assert!(lines[5].ends_with("18144 us"), "{out}");
    }

    #[test]
    fn an_idle_class_leaves_its_share() {
        let out = render(&args("4,2,1", &["high=max", "low=max"], "50000")).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        // Medium offers nothing: high 4/5, low 1/5 of the device.
        assert!(
            lines[3].contains("40.00k") && lines[3].contains("80.0%"),
            "{out}"
        );
        assert!(lines[4].trim_end().ends_with('-'), "{out}");
        assert!(
            lines[5].contains("10.00k") && lines[5].contains("20.0%"),
            "{out}"
        );
    }

    #[test]
    fn bad_arguments_are_named() {
        let e = render(&args("4,2", &["high=1"], "1000")).unwrap_err();
        assert!(e.to_string().contains("three weights"), "{e}");
        let e = render(&args("4,2,1", &["urgent=1"], "1000")).unwrap_err();
        assert!(e.to_string().contains("class must be"), "{e}");
        let e = render(&args("4,2,0", &["high=1"], "1000")).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
    }
}
