//! The discrete-event engine: closed-loop workers (clients) → network →
//! target-side scheduler → SSD model → network → clients.
//!
//! One event queue ordered by (time, sequence number) drives everything, so
//! a run is a pure function of its [`RunSpec`]. Per request:
//!
//! 1. a worker generates it when it has fewer than `queue_depth`
//!    outstanding (and its rate limit allows); it waits at the client until
//!    the client's gate lets it go (Gimbal credits, Parda's window);
//! 2. it reaches the target after the network delay (command capsule, plus
//!    the data for a write);
//! 3. the target scheduler dispatches it to the SSD model, which announces
//!    its completion time;
//! 4. the completion (with completion dword 1 from the scheduler) reaches
//!    the client after the network delay (plus the data for a read); the
//!    client's gate learns the credit or latency, and the worker issues
//!    its next I/O.
//!
//! Latency is measured from the moment the client sends the request to the
//! moment its completion arrives (what the paper reports as end-to-end
//! latency); time spent waiting at the client for a credit or a window is
//! reported separately as the application-visible latency.
//!
//! Safety checks run as the simulation goes (outstanding never above the
//! queue depth, the gate never exceeded, time never going backwards, a
//! bound on events); a failing check panics with the run's seed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::credit_gate::{CreditGate, CreditGateConfig, CreditMode};
use crate::sim::metrics::LatencySummary;
use crate::sim::rng::{derive_seed, SimRng};
use crate::sim::schedulers::{
    target_scheduler, PardaWindow, SchedulerKind, SchedulerParams, TargetRequest, TargetScheduler,
};
use crate::sim::workload::{AccessPattern, WorkerSpec, WORKER_REGION_BYTES};
use crate::ssd_model::{SsdModel, SsdModelConfig, SsdStats};
use crate::time::{Nanos, NANOS_PER_SEC};
use crate::types::IoKind;

/// The fabric between clients and the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// One-way delay of a capsule, including target and client software,
    /// in nanoseconds. Default 10 µs (RDMA through a SmartNIC target).
    pub one_way_ns: u64,
    /// Link speed for data, bytes per second. Default 12.5 GB/s (100 Gb/s).
    pub bytes_per_sec: u64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            one_way_ns: 10_000,
            bytes_per_sec: 12_500_000_000,
        }
    }
}

impl NetworkConfig {
    fn delay_ns(&self, data_bytes: u64) -> u64 {
        self.one_way_ns + data_bytes * NANOS_PER_SEC / self.bytes_per_sec.max(1)
    }
}

/// Everything a run depends on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The device (its seed is replaced by one derived from `seed`).
    pub ssd: SsdModelConfig,
    /// The tenants.
    pub workers: Vec<WorkerSpec>,
    /// The scheme.
    pub scheduler: SchedulerKind,
    /// Parameters of the schemes.
    pub params: SchedulerParams,
    /// The fabric.
    pub network: NetworkConfig,
    /// Simulated time to run, nanoseconds.
    pub duration_ns: u64,
    /// Completions before this time are not counted in bandwidth and
    /// latency (they still appear in time series).
    pub warmup_ns: u64,
    /// Interval of the time series; `None` for none.
    pub sample_interval_ns: Option<u64>,
    /// The one seed every random choice derives from.
    pub seed: u64,
}

/// What one worker achieved in the measured window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerOutcome {
    /// Its group label.
    pub group: String,
    /// I/Os completed.
    pub completed_ios: u64,
    /// Bytes completed per second.
    pub bandwidth_bytes_per_sec: f64,
    /// End-to-end latency (sent → completion at the client).
    pub latency: LatencySummary,
    /// Mean latency including the wait at the client's gate, µs.
    pub app_latency_mean_us: f64,
}

/// One point of a run's time series.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// End of the interval, nanoseconds.
    pub at_ns: u64,
    /// Bytes per second each worker completed in the interval.
    pub worker_bandwidth_bytes_per_sec: Vec<f64>,
    /// Mean device latency of reads completed in the interval, µs.
    pub read_device_latency_us: Option<f64>,
    /// Mean device latency of writes completed in the interval, µs.
    pub write_device_latency_us: Option<f64>,
    /// The scheduler's write cost at the end of the interval (Gimbal).
    pub write_cost: Option<f64>,
    /// The scheduler's target rate at the end of the interval (Gimbal),
    /// bytes per second.
    pub target_rate_bps: Option<f64>,
}

/// The outcome of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The scheme.
    pub scheduler: SchedulerKind,
    /// Per worker, in the order of [`RunSpec::workers`].
    pub workers: Vec<WorkerOutcome>,
    /// Bytes per second completed by all workers.
    pub total_bandwidth_bytes_per_sec: f64,
    /// End-to-end latency of all reads.
    pub read_latency: LatencySummary,
    /// End-to-end latency of all writes.
    pub write_latency: LatencySummary,
    /// End-to-end latency per worker group, in order of first appearance.
    pub groups: Vec<(String, LatencySummary)>,
    /// Time series, if asked for.
    pub samples: Vec<Sample>,
    /// Device counters at the end.
    pub device: SsdStats,
    /// Events processed (a measure of the run's cost).
    pub events: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A worker may be able to issue (start time or rate limit).
    WorkerWake(usize),
    /// A request reached the target.
    AtTarget(usize),
    /// The device completed a request.
    DeviceDone(usize),
    /// A completion reached the client.
    AtClient(usize),
    /// The target scheduler's timer.
    SchedulerWake,
    /// End of a time-series interval.
    Sample,
}

#[derive(Clone, Debug)]
struct Request {
    worker: usize,
    kind: IoKind,
    offset: u64,
    bytes: u64,
    created_ns: u64,
    sent_ns: u64,
    dispatched_ns: u64,
    dw1: u32,
}

enum ClientGate {
    Open { in_flight: u32 },
    Credit(Box<CreditGate>),
    Parda { window: PardaWindow, in_flight: u32 },
}

impl ClientGate {
    fn try_acquire(&mut self) -> bool {
        match self {
            ClientGate::Open { in_flight } => {
                *in_flight += 1;
                true
            }
            ClientGate::Credit(gate) => gate.try_acquire(),
            ClientGate::Parda { window, in_flight } => {
                if *in_flight < window.window() {
                    *in_flight += 1;
                    true
                } else {
                    false
                }
            }
        }
    }

    fn on_completion(&mut self, now: Nanos, kind: IoKind, bytes: u64, latency_ns: u64, dw1: u32) {
        match self {
            ClientGate::Open { in_flight } => *in_flight -= 1,
            ClientGate::Credit(gate) => gate.on_completion(now, kind, bytes, latency_ns, Some(dw1)),
            ClientGate::Parda { window, in_flight } => {
                *in_flight -= 1;
                window.on_completion(now, latency_ns);
            }
        }
    }

    fn in_flight(&self) -> u32 {
        match self {
            ClientGate::Open { in_flight } | ClientGate::Parda { in_flight, .. } => *in_flight,
            ClientGate::Credit(gate) => gate.in_flight(),
        }
    }
}

struct WorkerState {
    spec: WorkerSpec,
    rng: SimRng,
    gate: ClientGate,
    outstanding: u32,
    waiting: VecDeque<usize>,
    next_allowed_ns: u64,
    wake_at: Option<u64>,
    next_sequential_offset: u64,
    region_base: u64,
    completed_ios: u64,
    completed_bytes: u64,
    latencies_ns: Vec<u64>,
    app_latency_sum_ns: u64,
    interval_bytes: u64,
}

/// Upper bound on events per simulated second: a run that needs more is
/// spinning, not simulating.
const EVENTS_PER_SIM_SECOND_MAX: u64 = 50_000_000;

struct Engine {
    seed: u64,
    now_ns: u64,
    sequence: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    requests: Vec<Option<Request>>,
    free_handles: Vec<usize>,
    workers: Vec<WorkerState>,
    scheduler: Box<dyn TargetScheduler>,
    ssd: SsdModel,
    network: NetworkConfig,
    warmup_ns: u64,
    duration_ns: u64,
    scheduler_wake_at: Option<u64>,
    sample_interval_ns: Option<u64>,
    samples: Vec<Sample>,
    interval_device_latency: [(u64, u64); 2],
    read_latencies_ns: Vec<u64>,
    write_latencies_ns: Vec<u64>,
    processed: u64,
}

macro_rules! sim_check {
    ($engine:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            panic!(
                "simulation check failed (seed {}, t = {} ns): {}",
                $engine.seed,
                $engine.now_ns,
                format!($($msg)+)
            );
        }
    };
}

/// Runs one simulation.
pub fn run(spec: &RunSpec) -> RunResult {
    let mut engine = Engine::new(spec);
    engine.run();
    engine.finish(spec)
}

impl Engine {
    fn new(spec: &RunSpec) -> Self {
        let ssd_config = spec.ssd.clone().with_seed(derive_seed(spec.seed, "ssd"));
        let ssd = SsdModel::new(ssd_config).expect("valid SSD configuration");
        let workers = spec
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| WorkerState {
                spec: w.clone(),
                rng: SimRng::derive(spec.seed, &format!("worker-{i}")),
                gate: match spec.scheduler {
                    _ if w.ignores_credits => ClientGate::Open { in_flight: 0 },
                    SchedulerKind::Gimbal => {
                        let config = CreditGateConfig {
                            mode: CreditMode::Target,
                            ..CreditGateConfig::default()
                        };
                        ClientGate::Credit(Box::new(
                            CreditGate::new(&config).expect("valid gate configuration"),
                        ))
                    }
                    SchedulerKind::Parda => ClientGate::Parda {
                        window: PardaWindow::new(spec.params.parda.clone(), w.queue_depth),
                        in_flight: 0,
                    },
                    _ => ClientGate::Open { in_flight: 0 },
                },
                outstanding: 0,
                waiting: VecDeque::new(),
                next_allowed_ns: 0,
                wake_at: None,
                next_sequential_offset: 0,
                region_base: i as u64 * WORKER_REGION_BYTES,
                completed_ios: 0,
                completed_bytes: 0,
                latencies_ns: Vec::new(),
                app_latency_sum_ns: 0,
                interval_bytes: 0,
            })
            .collect();
        Engine {
            seed: spec.seed,
            now_ns: 0,
            sequence: 0,
            events: BinaryHeap::new(),
            requests: Vec::new(),
            free_handles: Vec::new(),
            workers,
            scheduler: target_scheduler(spec.scheduler, &spec.params, spec.workers.len()),
            ssd,
            network: spec.network.clone(),
            warmup_ns: spec.warmup_ns,
            duration_ns: spec.duration_ns,
            scheduler_wake_at: None,
            sample_interval_ns: spec.sample_interval_ns,
            samples: Vec::new(),
            interval_device_latency: [(0, 0); 2],
            read_latencies_ns: Vec::new(),
            write_latencies_ns: Vec::new(),
            processed: 0,
        }
    }

    fn schedule(&mut self, at_ns: u64, event: Event) {
        sim_check!(
            self,
            at_ns >= self.now_ns,
            "event {event:?} scheduled in the past at {at_ns}"
        );
        self.sequence += 1;
        self.events.push(Reverse((at_ns, self.sequence, event)));
    }

    fn run(&mut self) {
        for w in 0..self.workers.len() {
            let start = self.workers[w].spec.start_ns;
            self.workers[w].wake_at = Some(start);
            self.schedule(start, Event::WorkerWake(w));
        }
        if let Some(interval) = self.sample_interval_ns {
            self.schedule(interval, Event::Sample);
        }
        let events_max = EVENTS_PER_SIM_SECOND_MAX
            .saturating_mul(self.duration_ns.div_ceil(NANOS_PER_SEC).max(1));
        while let Some(&Reverse((at_ns, _, event))) = self.events.peek() {
            if at_ns > self.duration_ns {
                break;
            }
            self.events.pop();
            sim_check!(self, at_ns >= self.now_ns, "time went backwards to {at_ns}");
            self.now_ns = at_ns;
            self.processed += 1;
            sim_check!(self, self.processed <= events_max, "event bound exceeded");
            match event {
                Event::WorkerWake(w) => {
                    if self.workers[w].wake_at == Some(at_ns) {
                        self.workers[w].wake_at = None;
                    }
                    self.issue(w);
                }
                Event::AtTarget(handle) => {
                    let request = self.target_request(handle);
                    self.scheduler.enqueue(Nanos(at_ns), request);
                    self.pump();
                }
                Event::DeviceDone(handle) => self.device_done(handle),
                Event::AtClient(handle) => self.at_client(handle),
                Event::SchedulerWake => {
                    if self.scheduler_wake_at == Some(at_ns) {
                        self.scheduler_wake_at = None;
                    }
                    self.pump();
                }
                Event::Sample => self.sample(),
            }
        }
    }

    fn target_request(&self, handle: usize) -> TargetRequest {
        let r = self.requests[handle].as_ref().expect("live request");
        TargetRequest {
            handle,
            worker: r.worker,
            kind: r.kind,
            bytes: r.bytes,
        }
    }

    /// Generates I/O for worker `w` up to its queue depth and rate, then
    /// sends what its gate admits.
    fn issue(&mut self, w: usize) {
        let now = self.now_ns;
        loop {
            let worker = &mut self.workers[w];
            if !worker.spec.is_active(now) || worker.outstanding >= worker.spec.queue_depth {
                break;
            }
            if worker.next_allowed_ns > now {
                if worker.wake_at.is_none_or(|at| at > worker.next_allowed_ns) {
                    worker.wake_at = Some(worker.next_allowed_ns);
                    let at = worker.next_allowed_ns;
                    self.schedule(at, Event::WorkerWake(w));
                }
                break;
            }
            let spec = &worker.spec;
            let kind = if worker.rng.percent(spec.read_pct) {
                IoKind::Read
            } else {
                IoKind::Write
            };
            let slots = WORKER_REGION_BYTES / spec.io_bytes.max(1);
            let offset = match spec.pattern {
                AccessPattern::Random => {
                    worker.region_base + worker.rng.below(slots) * spec.io_bytes
                }
                AccessPattern::Sequential => {
                    let o = worker.next_sequential_offset;
                    worker.next_sequential_offset = (o + spec.io_bytes) % (slots * spec.io_bytes);
                    worker.region_base + o
                }
            };
            if let Some(rate) = spec.rate_limit_bytes_per_sec {
                let gap = spec.io_bytes * NANOS_PER_SEC / rate.max(1);
                worker.next_allowed_ns = worker.next_allowed_ns.max(now) + gap;
            }
            let bytes = spec.io_bytes;
            worker.outstanding += 1;
            let handle = self.allocate(Request {
                worker: w,
                kind,
                offset,
                bytes,
                created_ns: now,
                sent_ns: 0,
                dispatched_ns: 0,
                dw1: 0,
            });
            self.workers[w].waiting.push_back(handle);
        }
        self.send(w);
    }

    fn allocate(&mut self, request: Request) -> usize {
        match self.free_handles.pop() {
            Some(h) => {
                self.requests[h] = Some(request);
                h
            }
            None => {
                self.requests.push(Some(request));
                self.requests.len() - 1
            }
        }
    }

    fn send(&mut self, w: usize) {
        let now = self.now_ns;
        while let Some(&handle) = self.workers[w].waiting.front() {
            if !self.workers[w].gate.try_acquire() {
                break;
            }
            self.workers[w].waiting.pop_front();
            let request = self.requests[handle].as_mut().expect("live request");
            request.sent_ns = now;
            let data = if request.kind == IoKind::Write {
                request.bytes
            } else {
                0
            };
            let at = now + self.network.delay_ns(data);
            self.schedule(at, Event::AtTarget(handle));
        }
        let worker = &self.workers[w];
        sim_check!(
            self,
            worker.outstanding <= worker.spec.queue_depth,
            "worker {w} has {} outstanding above its queue depth",
            worker.outstanding
        );
        sim_check!(
            self,
            worker.gate.in_flight() <= worker.outstanding,
            "worker {w} gate counts {} in flight of {} outstanding",
            worker.gate.in_flight(),
            worker.outstanding
        );
    }

    /// Dispatches what the scheduler releases and arms its timer.
    fn pump(&mut self) {
        let now = Nanos(self.now_ns);
        let mut dispatched = 0usize;
        while let Some(request) = self.scheduler.poll_dispatch(now) {
            dispatched += 1;
            sim_check!(
                self,
                dispatched <= self.requests.len(),
                "dispatch loop does not end"
            );
            let r = self.requests[request.handle]
                .as_mut()
                .expect("live request");
            r.dispatched_ns = now.as_nanos();
            let done = self.ssd.submit(now, r.kind, r.offset, r.bytes).as_nanos();
            self.schedule(done, Event::DeviceDone(request.handle));
        }
        if let Some(wake) = self.scheduler.next_wakeup(now) {
            let wake = wake.as_nanos().max(self.now_ns + 1);
            if self.scheduler_wake_at.is_none_or(|at| at > wake) {
                self.scheduler_wake_at = Some(wake);
                self.schedule(wake, Event::SchedulerWake);
            }
        }
    }

    fn device_done(&mut self, handle: usize) {
        let now = self.now_ns;
        let request = self.target_request(handle);
        let dw1 = self.scheduler.complete(Nanos(now), request);
        let r = self.requests[handle].as_mut().expect("live request");
        r.dw1 = dw1;
        let device_latency = now - r.dispatched_ns;
        let slot = &mut self.interval_device_latency[r.kind.index()];
        slot.0 += device_latency;
        slot.1 += 1;
        let data = if r.kind == IoKind::Read { r.bytes } else { 0 };
        let at = now + self.network.delay_ns(data);
        self.schedule(at, Event::AtClient(handle));
        self.pump();
    }

    fn at_client(&mut self, handle: usize) {
        let now = self.now_ns;
        let r = self.requests[handle].take().expect("live request");
        self.free_handles.push(handle);
        let latency = now - r.sent_ns;
        let measured = now >= self.warmup_ns;
        let worker = &mut self.workers[r.worker];
        worker
            .gate
            .on_completion(Nanos(now), r.kind, r.bytes, latency, r.dw1);
        worker.outstanding -= 1;
        worker.interval_bytes += r.bytes;
        if measured {
            worker.completed_ios += 1;
            worker.completed_bytes += r.bytes;
            worker.latencies_ns.push(latency);
            worker.app_latency_sum_ns += now - r.created_ns;
            match r.kind {
                IoKind::Read => self.read_latencies_ns.push(latency),
                IoKind::Write => self.write_latencies_ns.push(latency),
            }
        }
        self.issue(r.worker);
    }

    fn sample(&mut self) {
        let interval = self.sample_interval_ns.expect("sampling is on");
        let secs = interval as f64 / NANOS_PER_SEC as f64;
        let worker_bandwidth_bytes_per_sec = self
            .workers
            .iter_mut()
            .map(|w| std::mem::take(&mut w.interval_bytes) as f64 / secs)
            .collect();
        let mean_us = |(sum, n): (u64, u64)| (n > 0).then(|| sum as f64 / n as f64 / 1e3);
        let [read, write] = std::mem::take(&mut self.interval_device_latency);
        self.samples.push(Sample {
            at_ns: self.now_ns,
            worker_bandwidth_bytes_per_sec,
            read_device_latency_us: mean_us(read),
            write_device_latency_us: mean_us(write),
            write_cost: self.scheduler.write_cost(),
            target_rate_bps: self.scheduler.target_rate_bps(),
        });
        let next = self.now_ns + interval;
        self.schedule(next, Event::Sample);
    }

    fn finish(mut self, spec: &RunSpec) -> RunResult {
        let secs =
            (self.duration_ns - self.warmup_ns.min(self.duration_ns)) as f64 / NANOS_PER_SEC as f64;
        let mut total_bytes = 0u64;
        let mut group_latencies: Vec<(String, Vec<u64>)> = Vec::new();
        for w in &self.workers {
            match group_latencies.iter_mut().find(|(g, _)| *g == w.spec.group) {
                Some((_, l)) => l.extend_from_slice(&w.latencies_ns),
                None => group_latencies.push((w.spec.group.clone(), w.latencies_ns.clone())),
            }
        }
        let groups = group_latencies
            .into_iter()
            .map(|(g, mut l)| (g, LatencySummary::from_nanos(&mut l)))
            .collect();
        let workers = self
            .workers
            .iter_mut()
            .map(|w| {
                total_bytes += w.completed_bytes;
                WorkerOutcome {
                    group: w.spec.group.clone(),
                    completed_ios: w.completed_ios,
                    bandwidth_bytes_per_sec: w.completed_bytes as f64 / secs,
                    latency: LatencySummary::from_nanos(&mut w.latencies_ns),
                    app_latency_mean_us: w.app_latency_sum_ns as f64
                        / w.completed_ios.max(1) as f64
                        / 1e3,
                }
            })
            .collect();
        RunResult {
            scheduler: spec.scheduler,
            workers,
            total_bandwidth_bytes_per_sec: total_bytes as f64 / secs,
            read_latency: LatencySummary::from_nanos(&mut self.read_latencies_ns),
            write_latency: LatencySummary::from_nanos(&mut self.write_latencies_ns),
            groups,
            samples: self.samples,
            device: self.ssd.stats(),
            events: self.processed,
        }
    }
}
