//! `GET /metrics`: the target's own state in Prometheus' text format
//! (`[metrics] listen` or `run --metrics-listen`; off by default).
//!
//! Nothing here keeps a counter of its own: each scrape reads what the
//! target already has, the same values `gimbal-view` status lines and
//! vendor log page C0h show (the switch's virtual view per namespace, each
//! tenant's credit and queues), the class arbiter's waiting requests, the
//! per-namespace request counters of the pipeline, and the connection
//! counts. Labels: `subsystem` (NQN), `namespace` (NSID), `host` (a
//! tenant's host NQN), `op`, `class`, `kind` (read or write), `state`.
//!
//! The page names every tenant's host NQN and the subsystems: serve it on
//! loopback or a management network only.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prom_exposition::{Exposition, Kind, MetricsServer};
use qos_core::congestion::CongestionState;

use crate::frontend::target::Target;
use crate::pipeline::{CLASS_NAMES, OP_NAMES};

/// Every state of the switch, as exported in `gimbal_target_switch_state`.
const STATES: [(CongestionState, &str); 4] = [
    (CongestionState::Underutilized, "underutilized"),
    (CongestionState::CongestionAvoidance, "congestion_avoidance"),
    (CongestionState::Congested, "congested"),
    (CongestionState::Overloaded, "overloaded"),
];

/// Starts the metrics responder for `target` on `listen`.
pub fn serve(target: Arc<Target>, listen: SocketAddr) -> std::io::Result<MetricsServer> {
    MetricsServer::start(listen, "metrics", move || render(&target))
}

/// One scrape of `target`.
pub fn render(target: &Target) -> String {
    let mut e = Exposition::new();
    let live = target.connections_live.load(Ordering::Relaxed);
    e.counter(
        "gimbal_target_connections_accepted_total",
        "TCP connections accepted (admin and I/O queues, discovery included).",
        &[],
        target.connections_accepted.load(Ordering::Relaxed),
    );
    e.gauge(
        "gimbal_target_connections",
        "TCP connections being served now.",
        &[],
        live as f64,
    );
    e.gauge(
        "gimbal_target_controllers",
        "Live controllers (host associations).",
        &[],
        target.controllers().len() as f64,
    );
    e.gauge(
        "gimbal_target_commands_in_flight",
        "Commands received and not yet completed, all queues.",
        &[],
        target.inflight.load(Ordering::Relaxed) as f64,
    );
    e.gauge(
        "gimbal_target_buffered_bytes",
        "Bytes of read and solicited write data all queues hold now (limits.max_buffered_bytes).",
        &[],
        target.buffered.used() as f64,
    );
    declare_switch_families(&mut e);
    for s in target.subsystems.values() {
        for n in s.namespaces.values() {
            let nsid = n.nsid.to_string();
            let ns: [(&str, &str); 2] = [("subsystem", s.nqn()), ("namespace", &nsid)];
            let qos = if n.pipeline.is_gimbal() {
                "gimbal"
            } else {
                "none"
            };
            let backend = n.config.backend.kind().to_string();
            e.gauge(
                "gimbal_target_namespace_info",
                "A namespace: its backend and QoS mode (value 1).",
                &[ns[0], ns[1], ("backend", &backend), ("qos", qos)],
                1.0,
            );
            e.gauge(
                "gimbal_target_namespace_size_bytes",
                "Namespace capacity.",
                &ns,
                (n.size_blocks << n.block_shift) as f64,
            );
            let c = n.pipeline.counters();
            for (i, op) in OP_NAMES.iter().enumerate() {
                let l = [ns[0], ns[1], ("op", op)];
                e.counter(
                    "gimbal_target_requests_total",
                    "I/O commands the namespace's pipeline was given, by operation.",
                    &l,
                    c.requests[i].load(Ordering::Relaxed),
                );
                e.counter(
                    "gimbal_target_request_bytes_total",
                    "Bytes those commands moved (zero for flush and discard).",
                    &l,
                    c.bytes[i].load(Ordering::Relaxed),
                );
            }
            let waiting = n.pipeline.class_waiting();
            for (i, class) in CLASS_NAMES.iter().enumerate() {
                let l = [ns[0], ns[1], ("class", class)];
                e.counter(
                    "gimbal_target_class_requests_total",
                    "I/O commands by NVMe priority class of their queue (none: a round-robin controller).",
                    &l,
                    c.class_requests[i].load(Ordering::Relaxed),
                );
                if let Some(w) = waiting.get(i) {
                    e.gauge(
                        "gimbal_target_class_waiting",
                        "Commands waiting in the namespace's class arbiter (device_queue_depth reached).",
                        &l,
                        *w as f64,
                    );
                }
            }
            if let Some(v) = n.pipeline.virtual_view() {
                switch_view(&mut e, target, &ns, &v);
            }
        }
    }
    e.finish()
}

/// The switch's families, declared even without a Gimbal namespace so that
/// a dashboard finds them.
fn declare_switch_families(e: &mut Exposition) {
    for (name, help) in SWITCH_GAUGES {
        e.declare(name, Kind::Gauge, help);
    }
}

const SWITCH_GAUGES: [(&str, &str); 12] = [
    (
        "gimbal_target_switch_state",
        "Congestion state of the Gimbal switch (1 for the current state).",
    ),
    (
        "gimbal_target_switch_target_rate_bytes_per_second",
        "Target submission rate of the switch, reads and writes together.",
    ),
    (
        "gimbal_target_switch_headroom_bytes_per_second",
        "Bytes per second more of a kind the switch would admit now.",
    ),
    (
        "gimbal_target_switch_write_cost",
        "Write cost: device time of a written byte relative to a read byte.",
    ),
    (
        "gimbal_target_switch_latency_ewma_seconds",
        "Completion latency moving average per kind (absent until one completed).",
    ),
    (
        "gimbal_target_switch_latency_threshold_seconds",
        "Dynamic latency threshold per kind.",
    ),
    (
        "gimbal_target_switch_allotted_slots",
        "Virtual slots each contending tenant may hold.",
    ),
    (
        "gimbal_target_switch_in_flight",
        "Requests the switch has at the device.",
    ),
    (
        "gimbal_target_switch_queued",
        "Requests queued at the switch ingress.",
    ),
    (
        "gimbal_target_tenant_credit",
        "Credit the switch reports to a tenant (host) in completions.",
    ),
    (
        "gimbal_target_tenant_queued",
        "A tenant's requests queued at the switch ingress.",
    ),
    (
        "gimbal_target_tenant_in_flight",
        "A tenant's requests at the device.",
    ),
];

fn help(name: &str) -> &'static str {
    SWITCH_GAUGES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, h)| h)
}

fn switch_view(
    e: &mut Exposition,
    target: &Target,
    ns: &[(&str, &str); 2],
    v: &qos_core::switch::VirtualView,
) {
    let g = |e: &mut Exposition, name: &str, extra: &[(&str, &str)], value: f64| {
        let labels: Vec<(&str, &str)> = ns.iter().chain(extra).copied().collect();
        e.gauge(name, help(name), &labels, value);
    };
    for (state, label) in STATES {
        let on = if v.congestion_state == state {
            1.0
        } else {
            0.0
        };
        g(e, "gimbal_target_switch_state", &[("state", label)], on);
    }
    g(
        e,
        "gimbal_target_switch_target_rate_bytes_per_second",
        &[],
        v.target_rate_bps as f64,
    );
    for (kind, headroom, ewma, threshold) in [
        (
            "read",
            v.read_headroom_bps,
            v.read_latency_ewma_ns,
            v.read_latency_threshold_ns,
        ),
        (
            "write",
            v.write_headroom_bps,
            v.write_latency_ewma_ns,
            v.write_latency_threshold_ns,
        ),
    ] {
        let k = [("kind", kind)];
        g(
            e,
            "gimbal_target_switch_headroom_bytes_per_second",
            &k,
            headroom as f64,
        );
        if let Some(ns) = ewma {
            g(
                e,
                "gimbal_target_switch_latency_ewma_seconds",
                &k,
                ns as f64 / 1e9,
            );
        }
        g(
            e,
            "gimbal_target_switch_latency_threshold_seconds",
            &k,
            threshold as f64 / 1e9,
        );
    }
    g(e, "gimbal_target_switch_write_cost", &[], v.write_cost);
    g(
        e,
        "gimbal_target_switch_allotted_slots",
        &[],
        f64::from(v.allotted_slots),
    );
    g(e, "gimbal_target_switch_in_flight", &[], v.in_flight as f64);
    g(e, "gimbal_target_switch_queued", &[], v.queued as f64);
    for t in &v.tenants {
        let host = target
            .tenant_nqn(t.tenant.0)
            .unwrap_or_else(|| t.tenant.to_string());
        let h = [("host", host.as_str())];
        g(e, "gimbal_target_tenant_credit", &h, f64::from(t.credit));
        g(e, "gimbal_target_tenant_queued", &h, t.queued as f64);
        g(e, "gimbal_target_tenant_in_flight", &h, t.in_flight as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_switch_family_has_help() {
        for (n, h) in SWITCH_GAUGES {
            assert!(n.starts_with("gimbal_target_") && !h.is_empty());
        }
    }
}
