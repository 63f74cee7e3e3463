//! `GET /metrics` on a running target: Prometheus' own parser
//! (`promtool check metrics`) accepts the page, every family the
//! dashboard (docs/grafana) uses is there, and the request counters
//! count what a host sent.

mod support;

use prom_exposition::check::{
    dashboard_queries, metric_names, promql_metrics, promtool_check, sample_value, scrape,
};
use support::*;

const CONFIG: &str = r#"
listen = ["127.0.0.1:0"]
[metrics]
listen = "127.0.0.1:0"
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "16MiB"
qos = "gimbal"
[[subsystem.namespace]]
nsid = 2
backend = "null"
size = "1MiB"
"#;

#[test]
fn the_page_parses_and_counts_a_hosts_requests() {
    let t = start_target(CONFIG);
    let metrics = t
        .metrics_addr()
        .expect("[metrics] listen starts a listener");
    let (head, before) = scrape(metrics);
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    promtool_check(&before).unwrap();

    let admin = TestHost::bring_up_as(t.local_addrs()[0], HOST_NQN, false, false, 1);
    let mut io = TestHost::connect_io(t.local_addrs()[0], admin.cntlid, 1, false, false);
    for i in 0..8u64 {
        let data = pattern(8192, i as u32);
        assert!(io.write(1, i * 16, &data, 512, 8192).status.is_success());
        let (cqe, got) = io.read(1, i * 16, 16, 512);
        assert!(cqe.status.is_success());
        assert_eq!(got, data);
    }
    let (_, after) = scrape(metrics);
    promtool_check(&after).unwrap();
    let ns = format!(r#"subsystem="{DEMO_NQN}",namespace="1""#);
    let v = |text: &str, series: &str| sample_value(text, series).unwrap_or(0.0);
    for op in ["read", "write"] {
        let series = format!("gimbal_target_requests_total{{{ns},op=\"{op}\"}}");
        assert_eq!(v(&before, &series), 0.0);
        assert_eq!(v(&after, &series), 8.0, "{series} in\n{after}");
        let series = format!("gimbal_target_request_bytes_total{{{ns},op=\"{op}\"}}");
        assert_eq!(v(&after, &series), 8.0 * 8192.0, "{series}");
    }
    assert_eq!(
        v(
            &after,
            &format!("gimbal_target_class_requests_total{{{ns},class=\"none\"}}")
        ),
        16.0
    );
    // The switch's view, with this host as a tenant.
    let tenant = format!("gimbal_target_tenant_credit{{{ns},host=\"{HOST_NQN}\"}}");
    assert!(v(&after, &tenant) >= 1.0, "{tenant} in\n{after}");
    let states: f64 = [
        "underutilized",
        "congestion_avoidance",
        "congested",
        "overloaded",
    ]
    .iter()
    .map(|s| {
        v(
            &after,
            &format!("gimbal_target_switch_state{{{ns},state=\"{s}\"}}"),
        )
    })
    .sum();
    assert_eq!(states, 1.0, "exactly one state is current");
    assert!(
        v(&after, "gimbal_target_connections_accepted_total") >= 2.0,
        "{after}"
    );
    // The plain namespace has counters but no switch.
    assert!(after.contains(&format!(
        r#"gimbal_target_namespace_info{{subsystem="{DEMO_NQN}",namespace="2",backend="null",qos="none"}} 1"#
    )));
    let names = metric_names(&after);
    for n in [
        "gimbal_target_switch_target_rate_bytes_per_second",
        "gimbal_target_switch_write_cost",
        "gimbal_target_class_waiting",
    ] {
        assert!(names.contains(n), "{n} missing");
    }
    drop((io, admin));
}

#[test]
fn no_listener_unless_configured() {
    let t = start_target(&CONFIG.replace("[metrics]\nlisten = \"127.0.0.1:0\"\n", ""));
    assert!(t.metrics_addr().is_none());
}

/// Every metric the Grafana dashboard (docs/grafana) asks for under
/// `gimbal_target_` is one the target exports.
#[test]
fn the_dashboard_uses_only_exported_metrics() {
    let t = start_target(CONFIG);
    let names = metric_names(&gimbal_target::metrics::render(t.target()));
    let exprs = dashboard_queries();
    let mut used = 0;
    for e in &exprs {
        for m in promql_metrics(e, "gimbal_target_", &names) {
            assert!(
                names.contains(&m),
                "the dashboard asks for {m}, which the target does not export ({e})"
            );
            used += 1;
        }
    }
    assert!(used > 10, "{used}");
}
