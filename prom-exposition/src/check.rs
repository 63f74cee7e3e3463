//! For tests of the daemons: scrape a responder and check the text with
//! Prometheus' own parser.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};

/// `GET /metrics` from `addr`: the response head and body. Panics on any
/// I/O error or a status other than 200 (for tests).
pub fn scrape(addr: SocketAddr) -> (String, String) {
    let mut c = TcpStream::connect(addr).expect("connect to the metrics listener");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nAccept: text/plain\r\n\r\n")
        .expect("send the request");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("read the response");
    let (head, body) = out
        .split_once("\r\n\r\n")
        .expect("a response head and body");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    (head.to_owned(), body.to_owned())
}

/// Runs `promtool check metrics` (`$PROMTOOL`, else `promtool` on `PATH`)
/// on `text`: `Err` with its output when it reports any problem, and when
/// promtool is not installed (never a silent pass: install Debian's
/// `prometheus` package; `tests/vm/setup-host.sh` does).
pub fn promtool_check(text: &str) -> Result<(), String> {
    let tool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&tool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot run `{tool} check metrics` ({e}): install Debian's `prometheus` package \
                 (tests/vm/setup-host.sh installs it) or point $PROMTOOL at promtool"
            )
        })?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .map_err(|e| format!("writing to promtool: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("promtool: {e}"))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && report.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("promtool check metrics ({}): {report}", out.status))
    }
}

/// The metric names `text` has samples or a `# TYPE` line for (histogram
/// series under their family name).
pub fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(n) = rest.split(' ').next() {
                names.insert(n.to_owned());
            }
        }
    }
    names
}

/// The value of the sample `series` (name and labels exactly as printed,
/// e.g. `x_total{op="read"}`), if present.
pub fn sample_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(series)?.strip_prefix(' ')?;
        v.parse().ok()
    })
}

/// The metric names starting with `prefix` that a PromQL expression
/// refers to (identifiers; label names and values inside `{...}` and
/// strings are skipped), histogram series (`_bucket`, `_sum`, `_count`)
/// under their family's name when `families` has it.
pub fn promql_metrics(
    expr: &str,
    prefix: &str,
    families: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0u32;
    let mut chars = expr.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            '"' => {
                // Skip a string, with its escapes.
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            c if depth == 0 && (c.is_ascii_alphabetic() || c == '_' || c == ':') => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                        end = j + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                let word = &expr[i..end];
                if word.starts_with(prefix) {
                    let family = ["_bucket", "_sum", "_count"]
                        .iter()
                        .filter_map(|s| word.strip_suffix(s))
                        .find(|base| families.contains(*base))
                        .unwrap_or(word);
                    out.push(family.to_owned());
                }
            }
            _ => {}
        }
    }
    out
}

/// The project's Grafana dashboard (both daemons' panels).
pub const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/grafana/ublk-nvmf-gimbal-target.json"
);

/// Every `expr` and variable `definition` in [`DASHBOARD`]. Panics if it
/// cannot be read or is not JSON (for tests).
pub fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(DASHBOARD).expect("the dashboard file");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    collect_queries(&dashboard, &mut out);
    out
}

fn collect_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_queries(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promql_names_are_found_outside_selectors() {
        let families = ["x_latency_seconds".to_owned()].into_iter().collect();
        let e = r#"histogram_quantile(0.9, sum by (le) (rate(x_latency_seconds_bucket{volume=~"x_fake"}[5m]))) / x_ios_total"#;
        assert_eq!(
            promql_metrics(e, "x_", &families),
            ["x_latency_seconds", "x_ios_total"]
        );
    }
}
