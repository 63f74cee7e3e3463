//! `GET /metrics`: a volume's counters in Prometheus' text format
//! (`[metrics] listen` in the volume file, or `run --metrics-listen`; off
//! by default).
//!
//! The values are those `ublk-nvmf status` shows ([`Volume::snapshot`]:
//! I/O counters, QoS, priority classes, replicas and resync) plus the
//! latency histograms of [`crate::volume::Stats::latency`], which only
//! this page shows. Each volume is its own process, so each serves its
//! own page on its own port; every series carries `volume`, so one
//! Prometheus job can scrape them all. Labels: `volume`, `op`, `class`,
//! `replica` (its index in the volume file, as in `status`), `state`,
//! `source`, `mode`, `limit`.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use prom_exposition::{Exposition, MetricsServer};

use crate::volume::{StatsSnapshot, Volume, LATENCY_OPS};

/// Window sources `status` names (`qos.window_source`; `none` until a
/// queue computed one).
const WINDOW_SOURCES: [&str; 5] = ["target", "initial", "estimate", "unlimited", "none"];
/// Credit modes (`[qos] credits`).
const CREDIT_MODES: [&str; 4] = ["auto", "target", "estimate", "off"];
/// Replica states (`status`).
const REPLICA_STATES: [&str; 4] = ["in-sync", "fencing", "failed", "resyncing"];

const TARGET_CREDIT_HELP: &str = "The credit total the target last reported (Gimbal targets only).";
const RESYNC_SECONDS_HELP: &str = "Estimated time until the running resync is done.";

/// Starts the responder for `vol` on `listen`. `device` is set once the
/// device is live (`/dev/ublkbN`, shown in `ublk_nvmf_volume_info`);
/// counters are served from the start.
pub fn serve(
    vol: Arc<Volume>,
    device: Arc<OnceLock<String>>,
    listen: SocketAddr,
) -> std::io::Result<MetricsServer> {
    MetricsServer::start(listen, "metrics", move || {
        render(&vol, device.get().map_or("", String::as_str))
    })
}

/// One scrape of `vol`.
pub fn render(vol: &Volume, device: &str) -> String {
    let s = vol.snapshot(device);
    let mut e = Exposition::new();
    // Families whose samples come and go: declared so that their HELP is
    // always there (and a dashboard check finds them).
    e.declare(
        "ublk_nvmf_target_credit",
        prom_exposition::Kind::Gauge,
        TARGET_CREDIT_HELP,
    );
    e.declare(
        "ublk_nvmf_replica_resync_remaining_seconds",
        prom_exposition::Kind::Gauge,
        RESYNC_SECONDS_HELP,
    );
    let v: (&str, &str) = ("volume", &s.volume);
    counters(&mut e, v, &s);
    for (i, op) in LATENCY_OPS.iter().enumerate() {
        e.histogram(
            "ublk_nvmf_io_latency_seconds",
            "Time from a request's arrival at the server to its answer, QoS waits included.",
            &[v, ("op", op)],
            &vol.stats.latency[i].snapshot(),
        );
    }
    qos(&mut e, v, &s);
    classes(&mut e, v, &s);
    replicas(&mut e, v, &s);
    cluster(&mut e, v, &s);
    e.finish()
}

/// Cluster mode (absent without `[cluster]`).
fn cluster(e: &mut Exposition, v: (&str, &str), s: &StatsSnapshot) {
    let Some(c) = &s.cluster else {
        return;
    };
    let l = [v];
    e.gauge(
        "ublk_nvmf_cluster_epoch",
        "The attach epoch this host owns the volume with (cluster mode).",
        &l,
        c.epoch as f64,
    );
    e.gauge(
        "ublk_nvmf_cluster_etcd_reachable",
        "1 while the last etcd request was answered.",
        &l,
        f64::from(u8::from(c.etcd_reachable)),
    );
    e.gauge(
        "ublk_nvmf_cluster_lease_remaining_seconds",
        "Seconds left on the owner lease at its last renewal (-1: unknown).",
        &l,
        c.lease_ttl_left_s as f64,
    );
    e.gauge(
        "ublk_nvmf_cluster_health_generation",
        "The replica health record's generation in etcd.",
        &l,
        c.health_generation as f64,
    );
    e.gauge(
        "ublk_nvmf_cluster_writes_held",
        "Writes held until etcd records a replica out of sync.",
        &l,
        c.writes_waiting as f64,
    );
    e.gauge(
        "ublk_nvmf_cluster_fenced",
        "1 once this host may not serve the volume any more (another owner).",
        &l,
        f64::from(u8::from(c.fenced.is_some())),
    );
}

fn counters(e: &mut Exposition, v: (&str, &str), s: &StatsSnapshot) {
    e.gauge(
        "ublk_nvmf_volume_info",
        "The volume's device and first target (value 1).",
        &[
            v,
            ("device", &s.device),
            ("target", &s.target),
            ("subnqn", &s.subnqn),
        ],
        1.0,
    );
    e.gauge(
        "ublk_nvmf_connected",
        "1 while a target controller of the volume is connected.",
        &[v],
        f64::from(u8::from(s.connected)),
    );
    for (op, n) in [
        ("read", s.reads),
        ("write", s.writes),
        ("flush", s.flushes),
        ("discard", s.discards),
    ] {
        e.counter(
            "ublk_nvmf_ios_total",
            "Requests completed successfully, by operation (discard includes write-zeroes).",
            &[v, ("op", op)],
            n,
        );
    }
    for (op, n) in [("read", s.read_bytes), ("write", s.write_bytes)] {
        e.counter(
            "ublk_nvmf_io_bytes_total",
            "Bytes read and written.",
            &[v, ("op", op)],
            n,
        );
    }
    e.counter(
        "ublk_nvmf_io_errors_total",
        "Requests failed back to the kernel.",
        &[v],
        s.errors,
    );
    e.gauge(
        "ublk_nvmf_ios_in_flight",
        "Requests in the server now.",
        &[v],
        s.inflight as f64,
    );
    e.counter(
        "ublk_nvmf_queue_reconnects_total",
        "I/O queue connection losses (each is reconnected; held I/O is redone).",
        &[v],
        s.queue_failures,
    );
    e.counter(
        "ublk_nvmf_controller_resets_total",
        "Controller resets (reconnects of a target's controller).",
        &[v],
        s.controller_resets,
    );
    e.counter(
        "ublk_nvmf_socket_sends_total",
        "Socket sends (each carries one or more commands).",
        &[v],
        s.sends,
    );
    e.counter(
        "ublk_nvmf_socket_receives_total",
        "Socket receives that brought bytes, direct ones included.",
        &[v],
        s.receives,
    );
    e.counter(
        "ublk_nvmf_socket_direct_receives_total",
        "Socket receives straight into a read's data (its buffer or pages).",
        &[v],
        s.direct_receives,
    );
    e.counter(
        "ublk_nvmf_socket_waited_receives_total",
        "Direct receives that waited in the kernel for their data (SO_RCVLOWAT raised to their length).",
        &[v],
        s.waited_receives,
    );
}

fn qos(e: &mut Exposition, v: (&str, &str), s: &StatsSnapshot) {
    let q = &s.qos;
    e.gauge(
        "ublk_nvmf_credit_window",
        "Requests the credit gate lets in flight, all queues.",
        &[v],
        f64::from(q.window),
    );
    for src in WINDOW_SOURCES {
        e.gauge(
            "ublk_nvmf_credit_window_source",
            "Where the window comes from: Gimbal credits (target), the initial window, the estimate, unlimited, or none yet (1 for the current one).",
            &[v, ("source", src)],
            f64::from(u8::from(q.window_source == src)),
        );
    }
    for mode in CREDIT_MODES {
        e.gauge(
            "ublk_nvmf_credit_mode",
            "The [qos] credits setting in force (1 for the current one).",
            &[v, ("mode", mode)],
            f64::from(u8::from(q.credits_mode == mode)),
        );
    }
    if let Some(c) = q.target_credit {
        e.gauge(
            "ublk_nvmf_target_credit",
            TARGET_CREDIT_HELP,
            &[v],
            f64::from(c),
        );
    }
    e.gauge(
        "ublk_nvmf_estimate_bandwidth_bytes_per_second",
        "The estimate's bottleneck bandwidth (0 before one was computed).",
        &[v],
        q.estimate_bandwidth_bps as f64,
    );
    e.gauge(
        "ublk_nvmf_estimate_base_latency_seconds",
        "The estimate's base latency (0 before one was computed).",
        &[v],
        q.estimate_base_us as f64 / 1e6,
    );
    e.gauge(
        "ublk_nvmf_estimate_gain",
        "The gain the estimate settled on, in bandwidth-delay products (0 before one was computed).",
        &[v],
        q.estimate_gain_x100 as f64 / 100.0,
    );
    e.gauge(
        "ublk_nvmf_estimate_neighbours",
        "Other volumes of the namespace on this host that the gates see (the host-local shadow view).",
        &[v],
        q.estimate_neighbours as f64,
    );
    e.gauge(
        "ublk_nvmf_estimate_neighbour_cost",
        "What the gain probe's last comparison cost those volumes: the sum of their log latency ratios (positive: slower).",
        &[v],
        q.estimate_neighbour_cost_x1000 as f64 / 1000.0,
    );
    for (dir, outcome, n) in [
        ("up", "kept", q.estimate_probes_up_kept),
        (
            "up",
            "dropped",
            q.estimate_probes_up
                .saturating_sub(q.estimate_probes_up_kept),
        ),
        ("down", "kept", q.estimate_probes_down_kept),
        (
            "down",
            "dropped",
            q.estimate_probes_down
                .saturating_sub(q.estimate_probes_down_kept),
        ),
    ] {
        e.counter(
            "ublk_nvmf_estimate_gain_probes_total",
            "Gain probes measured, by direction and whether the gain moved.",
            &[v, ("direction", dir), ("outcome", outcome)],
            n,
        );
    }
    e.gauge(
        "ublk_nvmf_qos_in_flight",
        "Requests admitted by the credit gate and not yet completed.",
        &[v],
        q.in_flight as f64,
    );
    e.gauge(
        "ublk_nvmf_qos_in_flight_max",
        "The most ever in flight on one queue.",
        &[v],
        q.in_flight_max as f64,
    );
    e.counter(
        "ublk_nvmf_over_credit_total",
        "Admissions above a queue's share of the window (the gate's invariant: stays 0).",
        &[v],
        q.over_credit,
    );
    e.gauge(
        "ublk_nvmf_local_queued",
        "Requests waiting in the server's local queues (limiter or credit gate).",
        &[v],
        q.queued as f64,
    );
    e.gauge(
        "ublk_nvmf_local_queued_max",
        "The most ever waiting in the local queues.",
        &[v],
        q.queued_max as f64,
    );
    e.counter(
        "ublk_nvmf_admitted_total",
        "Requests admitted to the target.",
        &[v],
        q.admitted,
    );
    e.counter(
        "ublk_nvmf_waited_total",
        "Admitted requests that had to wait in a local queue.",
        &[v],
        q.waited,
    );
    e.gauge(
        "ublk_nvmf_wait_mean_seconds",
        "Mean wait in the local queues over the admitted requests.",
        &[v],
        q.wait_us_mean as f64 / 1e6,
    );
    e.counter_f64(
        "ublk_nvmf_wait_seconds_total",
        "All waits in the local queues added up (rate over ublk_nvmf_waited_total's rate: the mean wait in an interval).",
        &[v],
        q.wait_us_total as f64 / 1e6,
    );
    e.gauge(
        "ublk_nvmf_wait_max_seconds",
        "Longest wait in the local queues.",
        &[v],
        q.wait_us_max as f64 / 1e6,
    );
    e.counter(
        "ublk_nvmf_limiter_delays_total",
        "Times the head request waited for the rate limiter.",
        &[v],
        q.limiter_delays,
    );
    e.counter(
        "ublk_nvmf_credit_waits_total",
        "Times the head request waited for a credit.",
        &[v],
        q.credit_waits,
    );
    for (limit, n) in [
        ("riops", q.riops),
        ("wiops", q.wiops),
        ("rbps", q.rbps),
        ("wbps", q.wbps),
    ] {
        e.gauge(
            "ublk_nvmf_rate_limit",
            "Rate limits in force (io.max names; IOPS or bytes per second; 0: unlimited).",
            &[v, ("limit", limit)],
            n as f64,
        );
    }
}

fn classes(e: &mut Exposition, v: (&str, &str), s: &StatsSnapshot) {
    for c in &s.priority.classes {
        let l = [v, ("class", c.class.as_str())];
        e.counter(
            "ublk_nvmf_class_ios_total",
            "Reads and writes completed, by NVMe priority class.",
            &l,
            c.ios,
        );
        e.counter(
            "ublk_nvmf_class_io_bytes_total",
            "Bytes read and written, by NVMe priority class.",
            &l,
            c.bytes,
        );
        e.counter(
            "ublk_nvmf_class_admitted_total",
            "Commands admitted to the target, by NVMe priority class.",
            &l,
            c.admitted,
        );
        e.gauge(
            "ublk_nvmf_class_queued",
            "Requests waiting in the local queues, by NVMe priority class.",
            &l,
            c.queued as f64,
        );
    }
}

fn replicas(e: &mut Exposition, v: (&str, &str), s: &StatsSnapshot) {
    for (i, r) in s.replicas.iter().enumerate() {
        let idx = i.to_string();
        let l = [v, ("replica", idx.as_str())];
        e.gauge(
            "ublk_nvmf_replica_info",
            "A replica of a mirrored volume: its target (value 1).",
            &[v, ("replica", &idx), ("target", &r.target)],
            1.0,
        );
        for st in REPLICA_STATES {
            e.gauge(
                "ublk_nvmf_replica_state",
                "A replica's state (1 for the current one).",
                &[v, ("replica", &idx), ("state", st)],
                f64::from(u8::from(r.status.state == st)),
            );
        }
        e.gauge(
            "ublk_nvmf_replica_connected",
            "1 while the replica's controller is connected.",
            &l,
            f64::from(u8::from(r.connected)),
        );
        e.counter(
            "ublk_nvmf_replica_reads_total",
            "Reads the replica served.",
            &l,
            r.reads,
        );
        e.gauge(
            "ublk_nvmf_replica_dirty_regions",
            "Regions the replica misses (write-intent bits).",
            &l,
            r.status.dirty_regions as f64,
        );
        e.gauge(
            "ublk_nvmf_replica_resync_copied_bytes",
            "Bytes the running resync has copied to the replica (0 when none runs).",
            &l,
            r.status.resync_bytes as f64,
        );
        e.gauge(
            "ublk_nvmf_replica_resync_remaining_bytes",
            "Bytes the running resync has left to copy, at most.",
            &l,
            r.status.resync_bytes_left as f64,
        );
        if let Some(t) = r.status.resync_seconds_left {
            e.gauge(
                "ublk_nvmf_replica_resync_remaining_seconds",
                RESYNC_SECONDS_HELP,
                &l,
                t as f64,
            );
        }
        e.gauge(
            "ublk_nvmf_replica_credit_window",
            "The replica's credit window (all queues).",
            &l,
            f64::from(r.qos.window),
        );
        e.gauge(
            "ublk_nvmf_replica_in_flight",
            "Requests in flight to the replica.",
            &l,
            r.qos.in_flight as f64,
        );
    }
}
