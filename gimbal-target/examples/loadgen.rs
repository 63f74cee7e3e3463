//! Closed-loop load against an in-process gimbal-target on loopback, for
//! two host-side benchmarks (they report; they assert nothing):
//!
//! - `overhead`: a `null` namespace with `qos = "none"` and one with
//!   `qos = "gimbal"` in the same target, 4 KiB random reads, interleaved
//!   rounds. Prints IOPS and IOPS per target-CPU-second (the CPU time of
//!   the target's own threads, the paper's "IOPS per core") for each.
//! - `fairness`: two tenants (two host NQNs) on one `sim` namespace, alone
//!   and together, with `qos = "gimbal"` and `"none"`; prints each tenant's
//!   f-Util (§5.1: mixed bandwidth over half its standalone bandwidth).
//!   The client ignores credits, like the kernel host.
//!
//! ```sh
//! cargo run --release -p gimbal-target --example loadgen -- overhead [SECS] [ROUNDS] [JOBS] [QD]
//! cargo run --release -p gimbal-target --example loadgen -- overhead-runs RUNS [SECS] [ROUNDS] [JOBS] [QD]
//! cargo run --release -p gimbal-target --example loadgen -- fairness [SECS] [TIME_SCALE] [sizes|types] [JOBS] [WARMUP_SECS]
//! ```
//!
//! `LOADGEN_PIN=1` (overhead) runs the target's threads on the last CPU and
//! the client's on the first; the summary gives the mean of the per-round
//! gimbal/none ratios with a 95 % confidence interval. `overhead-runs`
//! runs `overhead` RUNS times, each in a process of its own (runs differ
//! by more than their rounds do: thread placement, memory layout, the
//! host's neighbours), and gives the mean of the runs' means with a 95 %
//! confidence interval over the runs.
//!
//! `LOADGEN_TRACE=1` prints the switch's view while it runs
//! (`LOADGEN_TRACE_MS` apart in fairness runs); `LOADGEN_QOS=gimbal` or
//! `none` runs only that half of `fairness`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gimbal_target::config::TargetConfig;
use gimbal_target::server::{spawn, TargetHandle};
use nvmf_initiator::blocking::{ConnectOptions, Controller, HostIdentity};
use nvmf_initiator::queue::{Command, Request};
use nvmf_proto::fabrics::PriorityClass;

const SUBNQN: &str = "nqn.2026-01.io.gimbal:bench";

fn start(toml: &str) -> TargetHandle {
    let cfg = TargetConfig::parse(Path::new("loadgen.toml"), toml).expect("config");
    spawn(cfg).expect("target starts")
}

/// One closed-loop job's shape.
#[derive(Clone, Copy, Debug)]
struct Job {
    nsid: u32,
    bs: u32,
    qd: usize,
    write: bool,
    /// Sequential (for 128 KiB) or random offsets.
    random: bool,
}

/// Runs `jobs` (one I/O queue each, on one controller of host `host`) for
/// `warmup` + `secs` seconds; returns per job the bytes completed in the
/// last `secs` and the nanoseconds they took (fio's `ramp_time`).
fn run_jobs(
    addr: SocketAddr,
    host: &HostIdentity,
    jobs: &[Job],
    warmup: f64,
    secs: f64,
    stop: Arc<AtomicBool>,
) -> Vec<(u64, u64)> {
    let mut opts = ConnectOptions::new(addr, SUBNQN);
    opts.host = host.clone();
    opts.io_queues = jobs.len() as u16;
    let ctrl = Arc::new(Controller::connect(opts).expect("connect"));
    let ns_blocks: u64 = 256 * 1024 * 1024 / 512;
    let threads: Vec<_> = jobs
        .iter()
        .enumerate()
        .map(|(i, &job)| {
            let ctrl = ctrl.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut q = ctrl.io_queue(PriorityClass::Medium).expect("io queue");
                let blocks = u64::from(job.bs / 512);
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((i as u64 + 1) * 0x1234_5678);
                let mut seq = 0u64;
                let mut next_slba = move || {
                    if job.random {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        (rng % (ns_blocks / blocks)) * blocks
                    } else {
                        seq = (seq + blocks) % (ns_blocks - blocks);
                        seq
                    }
                };
                let submit = |q: &mut nvmf_initiator::blocking::IoQueue, slba: u64, buf| {
                    let command = if job.write {
                        Command::Write {
                            nsid: job.nsid,
                            slba,
                            block_size: 512,
                            fua: false,
                        }
                    } else {
                        Command::Read {
                            nsid: job.nsid,
                            slba,
                            block_size: 512,
                        }
                    };
                    q.submit(Request {
                        command,
                        buf: Some(buf),
                        user_data: 0,
                    });
                };
                for _ in 0..job.qd {
                    submit(&mut q, next_slba(), vec![0u8; job.bs as usize]);
                }
                let start = Instant::now() + Duration::from_secs_f64(warmup);
                let deadline = start + Duration::from_secs_f64(secs);
                let mut done = 0u64;
                let mut errors = 0u64;
                while let Some(c) = q.wait() {
                    match &c.result {
                        Ok(info) if info.status.is_success() => {
                            if Instant::now() >= start {
                                done += 1;
                            }
                        }
                        other => {
                            errors += 1;
                            if errors == 1 {
                                eprintln!("job {i}: {other:?}");
                            }
                        }
                    }
                    if Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                        let buf = c.buf.unwrap_or_else(|| vec![0u8; job.bs as usize]);
                        submit(&mut q, next_slba(), buf);
                    }
                }
                let elapsed = Instant::now().saturating_duration_since(start).as_nanos() as u64;
                let _ = q.disconnect();
                (done * u64::from(job.bs), elapsed)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// CPU time (user + system) of this process's threads named
/// `gimbal-target*` (the target's runtime and blocking pool), in seconds.
fn target_cpu_secs() -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut total = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let p = e.path();
            let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
            if !comm.starts_with("gimbal-target") && !comm.starts_with("tokio-runtime") {
                continue;
            }
            if let Ok(stat) = std::fs::read_to_string(p.join("stat")) {
                // Fields after the ")" of comm: state is field 3; utime 14, stime 15.
                let rest = stat.rsplit(')').next().unwrap_or("");
                let f: Vec<&str> = rest.split_whitespace().collect();
                if f.len() > 13 {
                    total += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    total as f64 / tick
}

/// Restricts the calling thread (and the threads it spawns later, which
/// inherit its mask) to one CPU. With `LOADGEN_PIN=1` the target is
/// started from a thread pinned to the last CPU and the client runs on the
/// first, so the target's threads have a core the load generator does not
/// share: IOPS per target CPU then measures the switch, not who the
/// scheduler happened to put next to it.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity(0) only changes
    // the calling thread's mask.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "loadgen: cannot pin to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Mean and the half-width of its 95 % confidence interval (Student's t,
/// two-sided) of `xs`.
fn mean_ci95(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    let mean = xs.iter().sum::<f64>() / n.max(1) as f64;
    if n < 2 {
        return (mean, f64::NAN);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    // t(0.975, n-1) for small n; 1.96 beyond the table.
    const T: [f64; 30] = [
        12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    let t = T.get(n - 2).copied().unwrap_or(1.96);
    (mean, t * (var / n as f64).sqrt())
}

fn overhead(args: &[String]) {
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let jobs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let qd: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(32);
    let pin = std::env::var_os("LOADGEN_PIN").is_some_and(|v| v != "0");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if pin {
        // The target's runtime, pacer and blocking threads inherit this.
        pin_to(cpus - 1);
    }
    let t = start(&format!(
        r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "{SUBNQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "null"
size = "256MiB"
qos = "none"
[[subsystem.namespace]]
nsid = 2
backend = "null"
size = "256MiB"
qos = "gimbal"
"#
    ));
    if pin {
        pin_to(0);
    }
    let addr = t.local_addrs()[0];
    let host = HostIdentity::random();
    let mut sums = [(0.0f64, 0.0f64); 2];
    // Per round, gimbal over none: rounds are paired so that drift in
    // the host's speed (other load, frequency) cancels within a pair.
    let mut ratios = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let mut this = [(0.0f64, 0.0f64); 2];
        // ABBA order: neither side always runs first (warm caches, the
        // other side's leftover threads).
        let order: [(usize, u32, &str); 2] = if round % 2 == 1 {
            [(0, 1, "none"), (1, 2, "gimbal")]
        } else {
            [(1, 2, "gimbal"), (0, 1, "none")]
        };
        for (slot, nsid, qos) in order {
            // LOADGEN_QOS=gimbal (or none) runs only that half (profiling).
            if std::env::var("LOADGEN_QOS").is_ok_and(|o| o != qos) {
                continue;
            }
            let job = Job {
                nsid,
                bs: 4096,
                qd,
                write: false,
                random: true,
            };
            let cpu0 = target_cpu_secs();
            let done_flag = AtomicBool::new(false);
            let res = std::thread::scope(|s| {
                if std::env::var_os("LOADGEN_TRACE").is_some() {
                    let ns = t.target().subsystems[SUBNQN].namespaces[&nsid].clone();
                    let done = &done_flag;
                    s.spawn(move || trace_view(&ns.pipeline, done));
                }
                let r = run_jobs(
                    addr,
                    &host,
                    &vec![job; jobs],
                    0.0,
                    secs,
                    Arc::new(AtomicBool::new(false)),
                );
                done_flag.store(true, Ordering::Relaxed);
                r
            });
            let cpu = target_cpu_secs() - cpu0;
            let ios: u64 = res.iter().map(|r| r.0 / 4096).sum();
            let elapsed = res.iter().map(|r| r.1).max().unwrap_or(1) as f64 / 1e9;
            let iops = ios as f64 / elapsed;
            let per_cpu = ios as f64 / cpu.max(0.01);
            sums[slot].0 += iops;
            sums[slot].1 += per_cpu;
            this[slot] = (iops, per_cpu);
            println!(
                "BENCH round={round} qos={qos} jobs={jobs} qd={qd} pinned={pin} iops={iops:.0} target_cpu_s={cpu:.2} iops_per_target_cpu_s={per_cpu:.0}"
            );
        }
        ratios.0.push(this[1].0 / this[0].0);
        ratios.1.push(this[1].1 / this[0].1);
    }
    println!(
        "BENCH summary gimbal/none iops_ratio={:.3} iops_per_cpu_ratio={:.3}",
        sums[1].0 / sums[0].0,
        sums[1].1 / sums[0].1
    );
    let (m_iops, h_iops) = mean_ci95(&ratios.0);
    let (m_cpu, h_cpu) = mean_ci95(&ratios.1);
    println!(
        "BENCH paired rounds={rounds} pinned={pin} iops_ratio_mean={m_iops:.3} ci95=[{:.3},{:.3}] iops_per_cpu_ratio_mean={m_cpu:.3} ci95=[{:.3},{:.3}]",
        m_iops - h_iops,
        m_iops + h_iops,
        m_cpu - h_cpu,
        m_cpu + h_cpu
    );
}

/// `overhead` in `runs` processes of their own; the runs' paired means
/// and their mean with a 95 % confidence interval over the runs.
fn overhead_runs(args: &[String]) {
    let runs: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(6);
    let exe = std::env::current_exe().expect("own executable");
    let (mut iops, mut per_cpu) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        let out = std::process::Command::new(&exe)
            .arg("overhead")
            .args(&args[1..])
            .output()
            .expect("run loadgen overhead");
        let text = String::from_utf8_lossy(&out.stdout);
        let Some(line) = text.lines().find(|l| l.starts_with("BENCH paired")) else {
            eprintln!("run {run}: no summary (exit {:?})", out.status);
            continue;
        };
        let field = |name: &str| -> Option<f64> {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        };
        let (Some(a), Some(b)) = (field("iops_ratio_mean"), field("iops_per_cpu_ratio_mean"))
        else {
            eprintln!("run {run}: unreadable summary: {line}");
            continue;
        };
        println!("BENCH run={run} iops_ratio_mean={a:.3} iops_per_cpu_ratio_mean={b:.3}");
        iops.push(a);
        per_cpu.push(b);
    }
    let (m_iops, h_iops) = mean_ci95(&iops);
    let (m_cpu, h_cpu) = mean_ci95(&per_cpu);
    println!(
        "BENCH runs={} iops_ratio={m_iops:.3} ci95=[{:.3},{:.3}] iops_per_cpu_ratio={m_cpu:.3} ci95=[{:.3},{:.3}]",
        iops.len(),
        m_iops - h_iops,
        m_iops + h_iops,
        m_cpu - h_cpu,
        m_cpu + h_cpu
    );
}

/// Prints the switch's view every 200 ms until `done` (with
/// `LOADGEN_TRACE`): what holds requests back, if anything.
fn trace_view(pipeline: &gimbal_target::pipeline::Pipeline, done: &AtomicBool) {
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        if let Some(v) = pipeline.virtual_view() {
            eprintln!(
                "trace state={:?} rate={} read_ewma={:?} thresh={} slots={} in_flight={} queued={}",
                v.congestion_state,
                v.target_rate_bps,
                v.read_latency_ewma_ns,
                v.read_latency_threshold_ns,
                v.allotted_slots,
                v.in_flight,
                v.queued
            );
        }
    }
}

/// Prints the switch's view every `LOADGEN_TRACE_MS` (default 500) ms of
/// real time during a fairness phase, until `done`.
fn trace_fairness(phase: &str, pipeline: &gimbal_target::pipeline::Pipeline, done: &AtomicBool) {
    let ms: u64 = std::env::var("LOADGEN_TRACE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(ms));
        if let Some(v) = pipeline.virtual_view() {
            eprintln!(
                "trace phase={phase} state={:?} rate={} write_cost={:.2} read_ewma={:?} write_ewma={:?} slots={} in_flight={} queued={}",
                v.congestion_state,
                v.target_rate_bps,
                v.write_cost,
                v.read_latency_ewma_ns,
                v.write_latency_ewma_ns,
                v.allotted_slots,
                v.in_flight,
                v.queued
            );
        }
    }
}

fn fairness(args: &[String]) {
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let scale: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100.0);
    let which = args.get(2).map(String::as_str).unwrap_or("sizes");
    let (profile, a, b) = match which {
        "types" => (
            "fragmented",
            Job {
                nsid: 0,
                bs: 4096,
                qd: 32,
                write: false,
                random: true,
            },
            Job {
                nsid: 0,
                bs: 4096,
                qd: 32,
                write: true,
                random: true,
            },
        ),
        _ => (
            "clean",
            Job {
                nsid: 0,
                bs: 4096,
                qd: 32,
                write: false,
                random: true,
            },
            Job {
                nsid: 0,
                bs: 128 * 1024,
                qd: 4,
                write: false,
                random: true,
            },
        ),
    };
    let jobs_per_tenant: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    // Seconds of each phase not measured: the switch adapts on device time
    // (about e^8 per device second), so after the writer-alone phase it
    // needs ~0.25 s of device time (25 s at 100x) to reach the mixed
    // phase's rate; `fairness_replay` shows the same in simulation.
    let warmup: f64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    // LOADGEN_QOS=gimbal (or none) runs only that half.
    let only = std::env::var("LOADGEN_QOS").ok();
    for (nsid, qos) in [(1u32, "gimbal"), (2, "none")] {
        if only.as_deref().is_some_and(|o| o != qos) {
            continue;
        }
        // A fresh target per qos: the sim device's state (write buffer,
        // GC) must not carry over.
        let t = start(&format!(
            r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "{SUBNQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = {nsid}
backend = "sim"
size = "256MiB"
profile = "{profile}"
time_scale = {scale}
qos = "{qos}"
"#
        ));
        let addr = t.local_addrs()[0];
        let (ha, hb) = (HostIdentity::random(), HostIdentity::random());
        let ja = vec![Job { nsid, ..a }; jobs_per_tenant];
        let jb = vec![Job { nsid, ..b }; jobs_per_tenant];
        let bw = |r: &[(u64, u64)]| -> f64 {
            r.iter()
                .map(|(bytes, ns)| *bytes as f64 / (*ns as f64 / 1e9))
                .sum::<f64>()
                / 1024.0
        };
        let stop = Arc::new(AtomicBool::new(false));
        let trace = std::env::var_os("LOADGEN_TRACE").is_some();
        let ns = t.target().subsystems[SUBNQN].namespaces[&nsid].clone();
        // Runs one phase, tracing the switch's view meanwhile if asked.
        let phase = |name: &str, f: &(dyn Fn() -> (f64, f64) + Sync)| -> (f64, f64) {
            let done_flag = AtomicBool::new(false);
            std::thread::scope(|s| {
                if trace {
                    let done = &done_flag;
                    let ns = &ns;
                    s.spawn(move || trace_fairness(name, &ns.pipeline, done));
                }
                let r = f();
                done_flag.store(true, Ordering::Relaxed);
                r
            })
        };
        let (alone_a, _) = phase("alone_a", &|| {
            (
                bw(&run_jobs(addr, &ha, &ja, warmup, secs, stop.clone())),
                0.0,
            )
        });
        let (_, alone_b) = phase("alone_b", &|| {
            (
                0.0,
                bw(&run_jobs(addr, &hb, &jb, warmup, secs, stop.clone())),
            )
        });
        let (mix_a, mix_b) = phase("mixed", &|| {
            std::thread::scope(|s| {
                let ta = s.spawn(|| bw(&run_jobs(addr, &ha, &ja, warmup, secs, stop.clone())));
                let mb = bw(&run_jobs(addr, &hb, &jb, warmup, secs, stop.clone()));
                (ta.join().unwrap(), mb)
            })
        });
        let fa = mix_a / (alone_a / 2.0);
        let fb = mix_b / (alone_b / 2.0);
        println!(
            "BENCH experiment={which} qos={qos} time_scale={scale} warmup_s={warmup} alone_a_kibps={alone_a:.0} alone_b_kibps={alone_b:.0} mixed_a_kibps={mix_a:.0} mixed_b_kibps={mix_b:.0} futil_a={fa:.2} futil_b={fb:.2}"
        );
        if let Some(view) = t
            .target()
            .subsystems
            .get(SUBNQN)
            .and_then(|s| s.namespaces.get(&nsid))
            .and_then(|n| n.pipeline.virtual_view())
        {
            println!(
                "VIEW qos={qos} state={:?} target_rate_bps={} write_cost={:.2} read_lat_ewma_ns={:?} write_lat_ewma_ns={:?} allotted_slots={}",
                view.congestion_state,
                view.target_rate_bps,
                view.write_cost,
                view.read_latency_ewma_ns,
                view.write_latency_ewma_ns,
                view.allotted_slots
            );
        }
        t.shutdown();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("overhead") => overhead(&args[1..]),
        Some("overhead-runs") => overhead_runs(&args[1..]),
        Some("fairness") => fairness(&args[1..]),
        _ => {
            eprintln!("usage: loadgen overhead [SECS] [ROUNDS] [JOBS] [QD] | overhead-runs RUNS [SECS] [ROUNDS] [JOBS] [QD] | fairness [SECS] [TIME_SCALE] [sizes|types] [JOBS] [WARMUP_SECS]");
            std::process::exit(2);
        }
    }
}
