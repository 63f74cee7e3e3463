//! Replays the readers-vs-writers fairness bench (`loadgen fairness ...
//! types` on the host, `tests/vm/run --bench gimbal-fairness` in the VM) in
//! qos-core's deterministic simulation, phase for phase: tenant A (4 KiB
//! random reads, 128 outstanding) alone, then tenant B (4 KiB random
//! writes, 128 outstanding) alone, then both, on one switch that carries
//! its state from phase to phase, with clients that ignore credits (as the
//! kernel host and `loadgen` do), on the fragmented DCT983 model.
//!
//! It separates what the switch policy does from what the real-time
//! pipeline (`sim` backend, pacing thread, timers) adds: if the replay and
//! the host agree, the pipeline is faithful and the numbers are the
//! policy's for phases that short.
//!
//! ```sh
//! # PHASE_MS and WARMUP_MS are device time per phase; the host bench at
//! # 100x with 14 s phases is 140 ms and no warm-up; the VM bench at 300x
//! # with 25 s warm-up + 15 s measured is 133 ms and 83 ms.
//! cargo run --release -p gimbal-target --example fairness_replay -- [PHASE_MS] [WARMUP_MS] [SEED] [MIXED_WARMUP_MS] [--trace] [--writer-first]
//! ```

use qos_core::config::GimbalConfig;
use qos_core::sim::engine::{run, NetworkConfig, RunSpec, Sample};
use qos_core::sim::schedulers::{SchedulerKind, SchedulerParams};
use qos_core::sim::workload::{AccessPattern, WorkerSpec};
use qos_core::ssd_model::SsdModelConfig;

const MS: u64 = 1_000_000;
const SAMPLE_NS: u64 = MS;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let trace = args.iter().any(|a| a == "--trace");
    // --writer-first: B alone, then A alone, then both (the mixed phase
    // starts from the readers' rate instead of the writer's).
    let writer_first = args.iter().any(|a| a == "--writer-first");
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let phase_ms = nums.first().copied().unwrap_or(140);
    let warmup_ms = nums
        .get(1)
        .copied()
        .unwrap_or(0)
        .min(phase_ms.saturating_sub(1));
    let seed = nums.get(2).copied().unwrap_or(1);
    // The mixed phase may warm up longer (as the VM bench's MIX_RAMP); it
    // measures as long as the others.
    let mix_warmup_ms = nums.get(3).copied().unwrap_or(warmup_ms);
    let t = phase_ms * MS;
    let mix_end = 2 * t + (mix_warmup_ms + phase_ms - warmup_ms) * MS;
    let worker = |write: bool, start: u64, stop: u64| WorkerSpec {
        start_ns: start,
        stop_ns: Some(stop),
        ignores_credits: true,
        ..if write {
            WorkerSpec::writer("B-4K-rand-write", 4096, 128, AccessPattern::Random)
        } else {
            WorkerSpec::reader("A-4K-rand-read", 4096, 128, AccessPattern::Random)
        }
    };
    // A alone, B alone, then A (a new connection of the same host: the
    // switch forgets an idle tenant's slots anyway) and B together.
    let (a_alone, b_alone) = if writer_first { (t, 0) } else { (0, t) };
    // A and B alone, then both again as new workers (new tenants to the
    // switch: an idle tenant holds no slots, so this matches the bench's
    // reconnecting jobs).
    let workers = vec![
        worker(false, a_alone, a_alone + t),
        worker(true, b_alone, b_alone + t),
        worker(false, 2 * t, mix_end),
        worker(true, 2 * t, mix_end),
    ];
    for (kind, name) in [
        (SchedulerKind::Gimbal, "gimbal"),
        (SchedulerKind::Fifo, "none"),
    ] {
        let spec = RunSpec {
            ssd: SsdModelConfig::dct983_fragmented(),
            workers: workers.clone(),
            scheduler: kind,
            params: SchedulerParams {
                // The target's configuration, not the report's 8 GiB/s
                // starting rate.
                gimbal: GimbalConfig::default(),
                ..SchedulerParams::default()
            },
            // Loopback: microseconds of real time, a fraction of a
            // microsecond of device time.
            network: NetworkConfig {
                one_way_ns: 1_000,
                ..NetworkConfig::default()
            },
            duration_ns: mix_end,
            warmup_ns: 0,
            sample_interval_ns: Some(SAMPLE_NS),
            seed,
        };
        let result = run(&spec);
        let s = &result.samples;
        let w = warmup_ms * MS;
        let mean = |worker: usize, from: u64, to: u64| -> f64 {
            let v: Vec<f64> = s
                .iter()
                .filter(|x| x.at_ns > from && x.at_ns <= to)
                .map(|x| x.worker_bandwidth_bytes_per_sec[worker])
                .collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let alone_a = mean(0, a_alone + w, a_alone + t);
        let alone_b = mean(1, b_alone + w, b_alone + t);
        let mix_from = 2 * t + mix_warmup_ms * MS;
        let mix_a = mean(2, mix_from, mix_end);
        let mix_b = mean(3, mix_from, mix_end);
        let mb = |x: f64| x / 1e6;
        println!(
            "REPLAY qos={name} phase_ms={phase_ms} warmup_ms={warmup_ms} mixed_warmup_ms={mix_warmup_ms} seed={seed} alone_a_MBps={:.0} alone_b_MBps={:.0} mixed_a_MBps={:.0} mixed_b_MBps={:.0} futil_a={:.2} futil_b={:.2}",
            mb(alone_a),
            mb(alone_b),
            mb(mix_a),
            mb(mix_b),
            mix_a / (alone_a / 2.0),
            mix_b / (alone_b / 2.0),
        );
        if trace && kind == SchedulerKind::Gimbal {
            print_trace(s, t);
        }
    }
}

/// The switch's rate and write cost every 10 ms of device time.
fn print_trace(samples: &[Sample], t: u64) {
    for x in samples.iter().filter(|x| x.at_ns % (10 * MS) == 0) {
        let phase = match x.at_ns {
            n if n <= 2 * t => "alone",
            _ => "mixed",
        };
        println!(
            "  t={:>4} ms {phase:<7} rate={:>6.0} MB/s write_cost={:.2} read_lat={} write_lat={} bw A={:.0} B={:.0} MB/s",
            x.at_ns / MS,
            x.target_rate_bps.unwrap_or(0.0) / 1e6,
            x.write_cost.unwrap_or(0.0),
            x.read_device_latency_us
                .map_or("-".into(), |v| format!("{v:.0} µs")),
            x.write_device_latency_us
                .map_or("-".into(), |v| format!("{v:.0} µs")),
            (x.worker_bandwidth_bytes_per_sec[0] + x.worker_bandwidth_bytes_per_sec[2]) / 1e6,
            (x.worker_bandwidth_bytes_per_sec[1] + x.worker_bandwidth_bytes_per_sec[3]) / 1e6,
        );
    }
}
