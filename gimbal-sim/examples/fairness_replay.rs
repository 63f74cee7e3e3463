//! Replays the fairness bench (`loadgen fairness ...` on the host,
//! `tests/vm/run --bench gimbal-fairness` in the VM) in qos-core's
//! deterministic simulation, phase for phase: tenant A alone, then tenant
//! B alone, then both, on one switch that carries its state from phase to
//! phase, with clients that ignore credits (as the kernel host and
//! `loadgen` do).
//!
//! - types-fragmented (the default): A 4 KiB random reads, B 4 KiB random
//!   writes, 128 outstanding each, on the fragmented DCT983 model.
//! - `--sizes` (sizes-clean): A 4 KiB random reads (512 outstanding), B
//!   128 KiB random reads (16 outstanding), on the clean model.
//!
//! `--qd-a=N` / `--qd-b=N` set a tenant's outstanding I/Os (the bench's
//! jobs x iodepth: one tenant is one worker here, as one host NQN is one
//! tenant to the switch). `--seeds=N` runs seeds SEED..SEED+N-1 and ends
//! with the f-Util range per scheme (the bench's simulated reference).
//!
//! f-Util is §5.1's: mixed bandwidth over (the device's standalone maximum
//! / 2), the maximum being FIFO's standalone bandwidth (as in the
//! simulation report, whose standalone maxima are FIFO's for every
//! scheme); `futil_own_*` divides by the scheme's own standalone bandwidth.
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
//! cargo run --release -p gimbal-sim --example fairness_replay -- [PHASE_MS] [WARMUP_MS] [SEED] [MIXED_WARMUP_MS] [--trace] [--writer-first] [--sizes] [--qd-a=N] [--qd-b=N] [--seeds=N]
//! # the VM bench's phases (300x: 25 s + 15 s alone, 75 s + 15 s mixed):
//! cargo run --release -p gimbal-sim --example fairness_replay -- 133 83 1 250 --sizes
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
    let sizes = args.iter().any(|a| a == "--sizes");
    let flag = |name: &str| -> Option<u32> {
        args.iter()
            .find_map(|a| a.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    let qd_a = flag("--qd-a").unwrap_or(if sizes { 512 } else { 128 });
    let qd_b = flag("--qd-b").unwrap_or(if sizes { 16 } else { 128 });
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
    let (experiment, ssd) = if sizes {
        ("sizes-clean", SsdModelConfig::dct983_clean())
    } else {
        ("types-fragmented", SsdModelConfig::dct983_fragmented())
    };
    // is_b: tenant B's workload, else tenant A's.
    let worker = |is_b: bool, start: u64, stop: u64| WorkerSpec {
        start_ns: start,
        stop_ns: Some(stop),
        ignores_credits: true,
        ..match (is_b, sizes) {
            (false, _) => WorkerSpec::reader("A-4K-rand-read", 4096, qd_a, AccessPattern::Random),
            (true, false) => {
                WorkerSpec::writer("B-4K-rand-write", 4096, qd_b, AccessPattern::Random)
            }
            (true, true) => {
                WorkerSpec::reader("B-128K-rand-read", 128 << 10, qd_b, AccessPattern::Random)
            }
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
    // f-Util as §5.1 and the simulation report define it: mixed bandwidth
    // over the device's standalone maximum (FIFO alone: what the device
    // gives the workload without a switch) / 2. `futil_own_*` divides by
    // the scheme's own standalone bandwidth instead (the VM bench's rounds
    // 1-3), which for Gimbal is its congestion control's ~84 % of the
    // device on 4 KiB reads.
    let seeds = flag("--seeds").unwrap_or(1).max(1) as u64;
    // Per scheme: (futil_a, futil_b, futil_own_a, futil_own_b) per seed.
    let mut ranges: Vec<(&str, Vec<[f64; 4]>)> = vec![("none", vec![]), ("gimbal", vec![])];
    for seed in seed..seed + seeds {
        let mut device_alone = (0.0, 0.0);
        for (i, (kind, name)) in [
            (SchedulerKind::Fifo, "none"),
            (SchedulerKind::Gimbal, "gimbal"),
        ]
        .into_iter()
        .enumerate()
        {
            let spec = RunSpec {
                ssd: ssd.clone(),
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
            if kind == SchedulerKind::Fifo {
                device_alone = (alone_a, alone_b);
            }
            let mix_from = 2 * t + mix_warmup_ms * MS;
            let mix_a = mean(2, mix_from, mix_end);
            let mix_b = mean(3, mix_from, mix_end);
            let futil = (
                mix_a / (device_alone.0 / 2.0),
                mix_b / (device_alone.1 / 2.0),
            );
            let own = (mix_a / (alone_a / 2.0), mix_b / (alone_b / 2.0));
            ranges[i].1.push([futil.0, futil.1, own.0, own.1]);
            let mb = |x: f64| x / 1e6;
            println!(
                "REPLAY experiment={experiment} qos={name} qd_a={qd_a} qd_b={qd_b} phase_ms={phase_ms} warmup_ms={warmup_ms} mixed_warmup_ms={mix_warmup_ms} seed={seed} alone_a_MBps={:.0} alone_b_MBps={:.0} mixed_a_MBps={:.0} mixed_b_MBps={:.0} futil_a={:.2} futil_b={:.2} futil_own_a={:.2} futil_own_b={:.2}",
                mb(alone_a),
                mb(alone_b),
                mb(mix_a),
                mb(mix_b),
                futil.0,
                futil.1,
                own.0,
                own.1,
            );
            if trace && kind == SchedulerKind::Gimbal {
                print_trace(s, t);
            }
        }
    }
    if seeds > 1 {
        for (name, v) in &ranges {
            let span = |k: usize| {
                let lo = v.iter().map(|x| x[k]).fold(f64::INFINITY, f64::min);
                let hi = v.iter().map(|x| x[k]).fold(f64::NEG_INFINITY, f64::max);
                format!("{lo:.2}-{hi:.2}")
            };
            println!(
                "RANGE experiment={experiment} qos={name} qd_a={qd_a} qd_b={qd_b} seeds={seed}-{} futil_a={} futil_b={} futil_own_a={} futil_own_b={}",
                seed + seeds - 1,
                span(0),
                span(1),
                span(2),
                span(3),
            );
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
