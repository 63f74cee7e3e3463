//! A volume's `GET /metrics` without a ublk device: the volume connects
//! to fake targets on loopback (a plain one and a two-replica mirror),
//! its metrics responder serves the page, and Prometheus' own parser
//! (`promtool check metrics`) accepts it; counters and histograms show
//! what was recorded. The device and the counters moving under fio are
//! the VM scenario `metrics`.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nvmf_initiator::blocking::HostIdentity;
use nvmf_initiator::fake_target::{FakeConfig, FakeTarget};
use prom_exposition::check::{
    dashboard_queries, metric_names, promql_metrics, promtool_check, sample_value, scrape,
};
use ublk_target::config::VolumeConfig;
use ublk_target::qos::priority::Source;
use ublk_target::volume::{Priority, Volume};

fn volume(text: &str) -> Arc<Volume> {
    let config = VolumeConfig::parse(Path::new("test.toml"), text).expect("volume config");
    assert_eq!(config.priority.source, Source::Fixed);
    let priority = Priority::new(config.priority, None, String::new());
    let host = HostIdentity::random();
    Arc::new(Volume::connect(config, host, priority, false, false).expect("volume connects"))
}

#[test]
fn a_volumes_page_parses_and_shows_its_counters() {
    let t = FakeTarget::new(FakeConfig::default());
    let s = t.serve();
    let vol = volume(&format!(
        "name = \"v1\"\n[target]\naddress = \"127.0.0.1\"\nport = {}\nsubnqn = \"{}\"\n\
         [priority]\nsource = \"fixed\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
        s.addr().port(),
        t.config().subnqn
    ));
    let device = Arc::new(OnceLock::new());
    let m = ublk_target::metrics::serve(
        Arc::clone(&vol),
        Arc::clone(&device),
        vol.config.metrics_listen.expect("[metrics] listen parsed"),
    )
    .unwrap();
    let (head, before) = scrape(m.local_addr());
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    promtool_check(&before).unwrap();

    // What the queue threads record per request.
    vol.stats.reads.fetch_add(3, Ordering::Relaxed);
    vol.stats.read_bytes.fetch_add(3 * 4096, Ordering::Relaxed);
    for us in [80, 120, 4000] {
        vol.stats.latency[0].observe(Duration::from_micros(us));
    }
    device.set("/dev/ublkb7".to_owned()).unwrap();
    let (_, after) = scrape(m.local_addr());
    promtool_check(&after).unwrap();
    let v = r#"volume="v1""#;
    let val = |series: String| sample_value(&after, &series);
    assert_eq!(
        val(format!("ublk_nvmf_ios_total{{{v},op=\"read\"}}")),
        Some(3.0)
    );
    assert_eq!(
        val(format!("ublk_nvmf_io_bytes_total{{{v},op=\"read\"}}")),
        Some(12288.0)
    );
    assert_eq!(
        val(format!(
            "ublk_nvmf_io_latency_seconds_bucket{{{v},op=\"read\",le=\"0.0001\"}}"
        )),
        Some(1.0)
    );
    assert_eq!(
        val(format!(
            "ublk_nvmf_io_latency_seconds_count{{{v},op=\"read\"}}"
        )),
        Some(3.0)
    );
    assert_eq!(val(format!("ublk_nvmf_connected{{{v}}}")), Some(1.0));
    assert!(after.contains("device=\"/dev/ublkb7\""), "{after}");
    let sources: f64 = ["target", "initial", "estimate", "unlimited", "none"]
        .iter()
        .filter_map(|s| {
            val(format!(
                "ublk_nvmf_credit_window_source{{{v},source=\"{s}\"}}"
            ))
        })
        .sum();
    assert_eq!(sources, 1.0, "exactly one window source\n{after}");
}

/// A two-replica mirror over two fake targets, and their servers.
fn mirror() -> (Arc<Volume>, Vec<Box<dyn std::any::Any>>) {
    let (a, b) = (
        FakeTarget::new(FakeConfig::default()),
        FakeTarget::new(FakeConfig {
            subnqn: "nqn.2026-01.io.test:fake-b".into(),
            ..FakeConfig::default()
        }),
    );
    let (sa, sb) = (a.serve(), b.serve());
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(&format!(
        "name = \"m\"\n[[replica]]\naddress = \"127.0.0.1\"\nport = {}\nsubnqn = \"{}\"\n\
         [[replica]]\naddress = \"127.0.0.1\"\nport = {}\nsubnqn = \"{}\"\n\
         [replication]\nbitmap_dir = \"{}\"\n[priority]\nsource = \"fixed\"\n",
        sa.addr().port(),
        a.config().subnqn,
        sb.addr().port(),
        b.config().subnqn,
        dir.path().display()
    ));
    (vol, vec![Box::new((a, b, sa, sb, dir))])
}

#[test]
fn a_mirrors_page_has_its_replicas() {
    let (vol, _keep) = mirror();
    let text = ublk_target::metrics::render(&vol, "/dev/ublkb1");
    promtool_check(&text).unwrap();
    // A new bitmap takes replica 0 as the source: it is in sync, and
    // replica 1 waits for a full copy; each has exactly one state.
    for (r, state) in [("0", Some("in-sync")), ("1", None)] {
        let series = |st: &str| {
            format!("ublk_nvmf_replica_state{{volume=\"m\",replica=\"{r}\",state=\"{st}\"}}")
        };
        let states = ["in-sync", "fencing", "failed", "resyncing"];
        let on: Vec<&str> = states
            .into_iter()
            .filter(|st| sample_value(&text, &series(st)) == Some(1.0))
            .collect();
        assert_eq!(on.len(), 1, "replica {r}: {on:?}\n{text}");
        if let Some(st) = state {
            assert_eq!(on, [st]);
        }
    }
    let names = metric_names(&text);
    for n in [
        "ublk_nvmf_replica_dirty_regions",
        "ublk_nvmf_replica_resync_copied_bytes",
        "ublk_nvmf_replica_resync_remaining_bytes",
    ] {
        assert!(names.contains(n), "{n}");
    }
}

/// Every metric the Grafana dashboard (docs/grafana) asks for under
/// `ublk_nvmf_` is one a volume's page has (a plain volume's and a
/// mirror's together), and every expression names a daemon's metric.
#[test]
fn the_dashboard_uses_only_exported_metrics() {
    let t = FakeTarget::new(FakeConfig::default());
    let s = t.serve();
    let plain = volume(&format!(
        "name = \"p\"\n[target]\naddress = \"127.0.0.1\"\nport = {}\nsubnqn = \"{}\"\n[priority]\nsource = \"fixed\"\n",
        s.addr().port(),
        t.config().subnqn
    ));
    let (mirror, _keep) = mirror();
    let mut names = metric_names(&ublk_target::metrics::render(&plain, "/dev/ublkb0"));
    names.extend(metric_names(&ublk_target::metrics::render(
        &mirror,
        "/dev/ublkb1",
    )));
    let exprs = dashboard_queries();
    assert!(exprs.len() > 20, "{} queries", exprs.len());
    let mut used = 0;
    for e in &exprs {
        assert!(
            e.contains("ublk_nvmf_") || e.contains("gimbal_target_"),
            "{e} names no metric of ours"
        );
        for m in promql_metrics(e, "ublk_nvmf_", &names) {
            assert!(
                names.contains(&m),
                "the dashboard asks for {m}, which no volume exports ({e})"
            );
            used += 1;
        }
    }
    assert!(used > 10);
}
