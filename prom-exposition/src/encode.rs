//! The text exposition format, version 0.0.4.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::histogram::HistogramSnapshot;

/// A metric family's type (its `# TYPE` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only ever goes up (until the process restarts); named `..._total`.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Cumulative buckets, sum and count.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

struct Family {
    name: String,
    help: String,
    kind: Kind,
    samples: String,
}

/// One scrape's text. Samples may be added in any order: they are grouped
/// under their family (the format requires a family's lines together),
/// and families appear in the order they were first used.
///
/// Names and label names are the caller's constants: an invalid one is a
/// bug and panics in debug builds. Label values and help text come from
/// configs and peers (volume names, host NQNs) and are escaped.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
    index: HashMap<String, usize>,
}

impl Exposition {
    /// An empty scrape.
    pub fn new() -> Self {
        Self::default()
    }

    /// The family `name`, declared on first use. A second use with another
    /// kind is a bug (debug panic); the first help text is kept.
    fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Family {
        debug_assert!(valid_metric_name(name), "metric name {name:?}");
        debug_assert!(
            kind != Kind::Counter || name.ends_with("_total"),
            "counter {name} must end in _total"
        );
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_owned(),
                    help: help.to_owned(),
                    kind,
                    samples: String::new(),
                });
                self.index.insert(name.to_owned(), self.families.len() - 1);
                self.families.len() - 1
            }
        };
        let f = &mut self.families[i];
        debug_assert_eq!(f.kind, kind, "metric {name} used with two types");
        f
    }

    /// A counter sample (`name` ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        let f = self.family(name, Kind::Counter, help);
        sample(&mut f.samples, name, labels, None, &value.to_string());
    }

    /// A counter sample with a fractional value (`name` ends in `_total`),
    /// e.g. seconds accumulated from a finer-grained integer count.
    pub fn counter_f64(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        let f = self.family(name, Kind::Counter, help);
        sample(&mut f.samples, name, labels, None, &format_value(value));
    }

    /// A gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        let f = self.family(name, Kind::Gauge, help);
        sample(&mut f.samples, name, labels, None, &format_value(value));
    }

    /// A histogram: `name_bucket{le=...}` for every bound and `+Inf`
    /// (cumulative), `name_sum` and `name_count` (equal to the `+Inf`
    /// bucket).
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        h: &HistogramSnapshot,
    ) {
        let f = self.family(name, Kind::Histogram, help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (i, n) in h.counts.iter().enumerate() {
            cumulative += n;
            let le = h
                .bounds
                .get(i)
                .map_or("+Inf".to_owned(), |b| format_value(*b));
            sample(
                &mut f.samples,
                &bucket,
                labels,
                Some(&le),
                &cumulative.to_string(),
            );
        }
        sample(
            &mut f.samples,
            &format!("{name}_sum"),
            labels,
            None,
            &format_value(h.sum_seconds),
        );
        sample(
            &mut f.samples,
            &format!("{name}_count"),
            labels,
            None,
            &cumulative.to_string(),
        );
    }

    /// Declares a family with no samples yet (so that a dashboard's query
    /// finds its HELP even before the first volume or tenant appears).
    pub fn declare(&mut self, name: &str, kind: Kind, help: &str) {
        self.family(name, kind, help);
    }

    /// The text: every family's `# HELP`, `# TYPE` and samples.
    pub fn finish(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
            out.push_str(&f.samples);
        }
        out
    }

    /// The names of the families declared so far (for tests and the
    /// dashboard check).
    pub fn family_names(&self) -> Vec<&str> {
        self.families.iter().map(|f| f.name.as_str()).collect()
    }
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], le: Option<&str>, value: &str) {
    out.push_str(name);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            debug_assert!(valid_label_name(k), "label name {k:?}");
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(k);
            out.push_str("=\"");
            escape_label_value(out, v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

/// A sample value as Go's `strconv.ParseFloat` reads it.
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Rust prints the shortest representation that round-trips, and
        // never in exponent form, which Go parses too.
        format!("{v}")
    }
}

/// Label values: backslash, double quote and line feed escaped.
fn escape_label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Help text: backslash and line feed escaped (quotes are legal there).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn valid_metric_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(n: &str) -> bool {
    let mut chars = n.chars();
    !n.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::{LatencyHistogram, LATENCY_BOUNDS_SECONDS};
    use std::time::Duration;

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut e = Exposition::new();
        e.counter(
            "x_reads_total",
            "Reads \\ done\nper volume \"v\".",
            &[("volume", "a\"b\\c\nd")],
            3,
        );
        assert_eq!(
            e.finish(),
            "# HELP x_reads_total Reads \\\\ done\\nper volume \"v\".\n\
             # TYPE x_reads_total counter\n\
             x_reads_total{volume=\"a\\\"b\\\\c\\nd\"} 3\n"
        );
    }

    #[test]
    fn samples_are_grouped_under_their_family() {
        let mut e = Exposition::new();
        e.gauge("x_window", "w", &[("volume", "a")], 1.0);
        e.counter("x_ios_total", "n", &[("volume", "a")], 1);
        e.gauge("x_window", "w", &[("volume", "b")], 2.5);
        let t = e.finish();
        assert_eq!(
            t,
            "# HELP x_window w\n# TYPE x_window gauge\nx_window{volume=\"a\"} 1\n\
             x_window{volume=\"b\"} 2.5\n# HELP x_ios_total n\n# TYPE x_ios_total counter\n\
             x_ios_total{volume=\"a\"} 1\n"
        );
        assert_eq!(e.family_names(), ["x_window", "x_ios_total"]);
    }

    #[test]
    fn fractional_counters_keep_their_fraction() {
        let mut e = Exposition::new();
        e.counter_f64("x_wait_seconds_total", "s", &[("volume", "a")], 0.002_5);
        assert_eq!(
            e.finish(),
            "# HELP x_wait_seconds_total s\n# TYPE x_wait_seconds_total counter\n\
             x_wait_seconds_total{volume=\"a\"} 0.0025\n"
        );
    }

    #[test]
    fn special_values_parse_in_go() {
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(0.00005), "0.00005");
        assert_eq!(format_value(1e20), "100000000000000000000");
    }

    #[test]
    fn histograms_are_cumulative_and_end_in_count() {
        let h = LatencyHistogram::new();
        for us in [10, 60, 60, 3_000, 20_000_000] {
            h.observe(Duration::from_micros(us));
        }
        let s = h.snapshot();
        let mut e = Exposition::new();
        e.histogram("x_latency_seconds", "l", &[("op", "read")], &s);
        let t = e.finish();
        let buckets: Vec<(f64, u64)> = t
            .lines()
            .filter(|l| l.starts_with("x_latency_seconds_bucket"))
            .map(|l| {
                let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, l.rsplit(' ').next().unwrap().parse().unwrap())
            })
            .collect();
        assert_eq!(buckets.len(), LATENCY_BOUNDS_SECONDS.len() + 1);
        assert!(buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(buckets[0], (0.00005, 1));
        assert_eq!(buckets[1], (0.0001, 3));
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, 5));
        assert!(
            t.contains("x_latency_seconds_count{op=\"read\"} 5\n"),
            "{t}"
        );
        let sum: f64 = t
            .lines()
            .find(|l| l.starts_with("x_latency_seconds_sum"))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 20.00313).abs() < 1e-9, "{sum}");
        // `le` comes after the family's own labels.
        assert!(t.contains("x_latency_seconds_bucket{op=\"read\",le=\"+Inf\"} 5\n"));
    }

    #[test]
    fn declared_families_without_samples_still_have_help_and_type() {
        let mut e = Exposition::new();
        e.declare("x_up", Kind::Gauge, "up");
        assert_eq!(e.finish(), "# HELP x_up up\n# TYPE x_up gauge\n");
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_metric_name("ublk_nvmf_reads_total"));
        assert!(!valid_metric_name("1x"));
        assert!(!valid_metric_name("a-b"));
        assert!(valid_label_name("volume"));
        assert!(!valid_label_name("__name__"));
        assert!(!valid_label_name("a b"));
    }
}
