//! The server subcommands: `run`, `demo`, `add`, `recover`, `del`, `list`,
//! `status`, `udev-name`.

mod demo_target;

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use ublk_target::config::{persistent_host_identity, ConnectArgs, VolumeConfig};
use ublk_target::control::state::{self, DeviceState};
use ublk_target::io::ublk::{self, DevState, Serve};
use ublk_target::replication::Copier;
use ublk_target::volume::Volume;

use demo_target::DemoTarget;

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// SIGINT/SIGTERM set the returned flag (checked by the device loop).
fn stop_on_signals() -> Arc<AtomicBool> {
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&stop);
    std::thread::spawn(move || loop {
        if SIGNALLED.load(Ordering::SeqCst) {
            s2.store(true, Ordering::SeqCst);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    });
    stop
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    pid > 0 && unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
}

/// What `run` should do with an existing saved state.
fn recovery_target(dir: &Path, name: &str) -> anyhow::Result<Option<DeviceState>> {
    let Some(st) = state::load(dir, name)? else {
        return Ok(None);
    };
    if st.pid != std::process::id()
        && pid_alive(st.pid)
        && state::request(dir, name, "ping").is_ok()
    {
        bail!(
            "volume {name} is already served by pid {} on {}",
            st.pid,
            st.device()
        );
    }
    match ublk::device_state(st.dev_id) {
        Some(DevState::Quiesced) => Ok(Some(st)),
        Some(DevState::Live) => bail!(
            "{} of volume {name} is live but its server is gone; stop it with `ublk-nvmf del {name}`",
            st.device()
        ),
        Some(_) => {
            // Dead or failing: nothing to recover, start afresh.
            let _ = ublk::delete_device(st.dev_id);
            state::remove(dir, name);
            Ok(None)
        }
        None => {
            state::remove(dir, name);
            Ok(None)
        }
    }
}

/// Serve `config` in the foreground until SIGINT/SIGTERM (or `del`).
/// `announce` prints the device path when live.
pub fn run(config: VolumeConfig, announce: bool, takeover: bool) -> anyhow::Result<()> {
    ublk::check_available()?;
    let dir = state::run_dir();
    let recover = recovery_target(&dir, &config.name)?;
    let vol = open_volume(&config, recover.as_ref(), takeover)?;
    let device = Arc::new(std::sync::OnceLock::new());
    let _metrics = match config.metrics_listen {
        Some(addr) => {
            let m = ublk_target::metrics::serve(Arc::clone(&vol), Arc::clone(&device), addr)
                .with_context(|| format!("volume {}: metrics on {addr}", config.name))?;
            log::info!(
                "volume {}: metrics on http://{}/metrics",
                config.name,
                m.local_addr()
            );
            Some(m)
        }
        None => None,
    };
    let stop = stop_on_signals();
    let manager = ReplicationManager::start(&vol);
    let live = DeviceLive {
        device,
        vol: Arc::clone(&vol),
        dir: dir.clone(),
        config_path: std::fs::canonicalize(&config.path).unwrap_or(config.path.clone()),
        stop: Arc::clone(&stop),
        announce,
    };
    let res = ublk::serve(
        Serve {
            volume: Arc::clone(&vol),
            recover_id: recover.as_ref().map(|s| s.dev_id),
            stop: Arc::clone(&stop),
        },
        Box::new(move |dev_id| live.on_live(dev_id)),
    );
    manager.stop();
    if stop.load(Ordering::SeqCst) {
        shut_down(&vol, &dir, res.is_ok());
    }
    res?;
    Ok(())
}

/// Connect the volume's targets (the host identity from the config, or
/// this machine's persistent one); when taking over `recover`'s device,
/// check that it was made for the same namespace.
fn open_volume(
    config: &VolumeConfig,
    recover: Option<&DeviceState>,
    takeover: bool,
) -> anyhow::Result<Arc<Volume>> {
    let name = &config.name;
    let host = match &config.host {
        Some(h) => h.clone(),
        None => persistent_host_identity(&state::lib_dir())
            .with_context(|| format!("host identity in {}", state::lib_dir().display()))?,
    };
    let priority = open_priority(config);
    // Volume::connect names the target (or replica) in its errors.
    let vol = Volume::connect(config.clone(), host, priority, recover.is_some(), takeover)
        .with_context(|| format!("volume {name}"))?;
    if let Some(st) = recover {
        if st.target != vol.identity {
            bail!(
                "volume {name}: {} was created for a different namespace ({:?}); refusing to recover it onto {:?}",
                st.device(),
                st.target,
                vol.identity
            );
        }
        log::warn!("volume {name}: recovering {}", st.device());
    }
    Ok(Arc::new(vol))
}

/// What happens once the device is live (called by `ublk::serve` from its
/// own thread).
struct DeviceLive {
    /// The device's path once live, for the metrics page.
    device: Arc<std::sync::OnceLock<String>>,
    vol: Arc<Volume>,
    dir: std::path::PathBuf,
    config_path: std::path::PathBuf,
    /// Set by a `stop` request on the control socket.
    stop: Arc<AtomicBool>,
    announce: bool,
}

impl DeviceLive {
    /// Register the device with the priority side channel, save its state
    /// (for `list`, `recover`, udev), open the control socket, and tell
    /// systemd and the user.
    fn on_live(self, dev_id: u32) {
        let vol = &self.vol;
        vol.priority
            .register(dev_id, vol.config.queues, vol.config.queue_depth);
        let st = DeviceState {
            volume: vol.config.name.clone(),
            config: self.config_path,
            dev_id,
            pid: std::process::id(),
            target: vol.identity.clone(),
        };
        let device = st.device();
        let _ = self.device.set(device.clone());
        if let Err(e) = state::save(&self.dir, &st) {
            log::error!("saving state: {e}");
        }
        let control = ControlHandler {
            vol: Arc::clone(vol),
            device: device.clone(),
            stop: self.stop,
        };
        if let Err(e) = state::serve_control(&self.dir, &st.volume, move |line| control.reply(line))
        {
            log::error!("control socket: {e}");
        }
        let _ = ublk_target::control::notify::notify(&format!("READY=1\nSTATUS=serving {device}"));
        if self.announce {
            println!("{device}");
        }
        log::warn!("volume {}: {device} is live", st.volume);
    }
}

/// Answers the control socket's requests for a live device.
struct ControlHandler {
    vol: Arc<Volume>,
    device: String,
    stop: Arc<AtomicBool>,
}

impl ControlHandler {
    /// The reply to one request line.
    fn reply(&self, line: &str) -> String {
        let vol = &self.vol;
        match line {
            "ping" => "pong\n".into(),
            "status-json" => {
                serde_json::to_string(&vol.snapshot(&self.device)).unwrap_or_default() + "\n"
            }
            "status" => format_status(&vol.snapshot(&self.device)),
            "reload" => control_reload(vol),
            l if l.starts_with("set ") => {
                let words: Vec<&str> = l[4..].split_whitespace().collect();
                control_set(vol, &words)
            }
            "stop" => {
                self.stop.store(true, Ordering::SeqCst);
                "stopping\n".into()
            }
            other => format!("error: unknown request {other:?}\n"),
        }
    }
}

/// The thread of a replicated volume that fences, reconnects and resyncs
/// replicas in the background (none for a plain volume).
struct ReplicationManager {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReplicationManager {
    fn start(vol: &Arc<Volume>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = vol.replication.is_some().then(|| {
            let vol = Arc::clone(vol);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("replication".into())
                .spawn(move || manage_replicas(&vol, &stop))
        });
        let thread = match thread {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => {
                log::error!("volume {}: replication thread: {e}", vol.config.name);
                None
            }
            None => None,
        };
        Self { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread {
            let _ = h.join();
        }
    }
}

/// The replication manager's loop, until `stop` is set.
fn manage_replicas(vol: &Volume, stop: &AtomicBool) {
    let copiers: Vec<Copier<'_>> = vol
        .replicas
        .iter()
        .map(|t| Copier {
            ctrl: &t.ctrl,
            nsid: t.spec.nsid,
        })
        .collect();
    if let Some(rep) = &vol.replication {
        rep.run_manager(&copiers, vol.geometry.block_size, stop);
    }
}

/// After an orderly stop (signal or `del`): record a clean shutdown in the
/// intent log when every request was answered (`served_ok`), and remove
/// the saved state. (When the queues went down instead, the state stays
/// for `recover`.)
fn shut_down(vol: &Volume, dir: &Path, served_ok: bool) {
    if let (Some(rep), true) = (&vol.replication, served_ok) {
        // Every request was answered before the device went away.
        rep.close_clean();
    }
    if let Some(c) = &vol.cluster {
        // After the local log: a clean record in etcd, then the owner key
        // goes (the next attach need not wait for the lease).
        c.stop_and_wait(served_ok);
    }
    state::remove(dir, &vol.config.name);
}

/// The volume's priority state: with `source = "ionice"` the BPF side
/// channel is loaded here, once; when it cannot be, the reason is logged
/// once and the volume uses its configured class.
///
/// Test and diagnostic hooks (environment): `UBLK_NVMF_IOPRIO_BTF` (the
/// kernel BTF file to use), `UBLK_NVMF_IOPRIO_TRACEPOINT` (attach to
/// another tracepoint: an unknown name makes the kernel refuse the
/// program), `UBLK_NVMF_IOPRIO_UNPRIVILEGED=1` (behave as without
/// CAP_BPF/CAP_PERFMON).
pub fn open_priority(config: &VolumeConfig) -> ublk_target::volume::Priority {
    use ioprio_channel::{Mode, Options, PriorityChannel};
    use ublk_target::qos::priority::Source;
    let pc = config.priority;
    if pc.source == Source::Fixed {
        return ublk_target::volume::Priority::new(pc, None, String::new());
    }
    let mut opts = Options::default();
    if let Ok(p) = std::env::var("UBLK_NVMF_IOPRIO_BTF") {
        opts.btf_path = p.into();
    }
    if let Ok(t) = std::env::var("UBLK_NVMF_IOPRIO_TRACEPOINT") {
        opts.tracepoint = t;
    }
    opts.simulate_unprivileged =
        std::env::var("UBLK_NVMF_IOPRIO_UNPRIVILEGED").as_deref() == Ok("1");
    let (channel, mode) = PriorityChannel::open_or_fallback(&opts);
    if let Mode::Fallback(why) = &mode {
        log::warn!(
            "volume {}: ioprio side channel unavailable ({why}); every request uses class {}",
            config.name,
            ublk_target::qos::priority::class_name(pc.class)
        );
    } else {
        log::info!("volume {}: ioprio side channel loaded", config.name);
    }
    ublk_target::volume::Priority::new(pc, channel, mode.to_string())
}

/// `set` on the control socket: apply, log, answer with the settings now
/// in force (or `error: ...`).
fn control_set(vol: &Volume, words: &[&str]) -> String {
    // The settings outside [qos]: how zero copy sends large writes, and
    // which reads wait for all their data in one receive.
    let (io, words): (Vec<&str>, Vec<&str>) = words
        .iter()
        .partition(|w| IO_SETTINGS.iter().any(|k| w.starts_with(&format!("{k}="))));
    let mut io_set = Vec::new();
    for w in &io {
        let (key, v) = w.split_once('=').expect("partitioned on key=");
        match parse_io_size(v) {
            Some(n) => io_set.push((key, n)),
            None => {
                return format!(
                    "error: {w:?}: expected a size of at least 4k (k/m suffixes), max (never) \
                     or default\n"
                )
            }
        }
    }
    let mut line = None;
    if !words.is_empty() || io_set.is_empty() {
        let q = &vol.qos;
        match ublk_target::qos::apply_settings(&q.settings(), &words) {
            Ok(c) => {
                q.apply(q.now(Instant::now()), &c);
                line = Some(format_settings(&c));
            }
            Err(e) => return format!("error: {e}\n"),
        }
    }
    for (key, n) in io_set {
        // The value in force (`default` stores 0).
        let s = &vol.stats;
        let set = match key {
            "write_pages_min" => {
                s.write_pages_min.store(n, Ordering::Relaxed);
                format!("{key}={}", s.write_pages_min())
            }
            "head_copy_min" => {
                s.head_copy_min.store(n, Ordering::Relaxed);
                format!("{key}={}", s.head_copy_min())
            }
            _ => {
                s.read_wait_min.store(n, Ordering::Relaxed);
                format!("{key}={}", s.read_wait_min())
            }
        };
        line = Some(match line {
            Some(l) => format!("{l} {set}"),
            None => set,
        });
    }
    let line = line.expect("one of the two was set");
    log::warn!("volume {}: set: {line}", vol.config.name);
    format!("{line}\n")
}

/// The run-time settings of the data path (`set NAME KEY=SIZE`), beside
/// the `[qos]` ones: `write_pages_min` ([`Stats::write_pages_min`]),
/// `read_wait_min` ([`Stats::read_wait_min`]) and `head_copy_min`
/// ([`Stats::head_copy_min`]).
///
/// [`Stats::write_pages_min`]: ublk_target::volume::Stats::write_pages_min
/// [`Stats::read_wait_min`]: ublk_target::volume::Stats::read_wait_min
/// [`Stats::head_copy_min`]: ublk_target::volume::Stats::head_copy_min
const IO_SETTINGS: [&str; 3] = ["write_pages_min", "read_wait_min", "head_copy_min"];

/// A data-path setting's value: a size of at least 4 KiB (below that the
/// choice it makes costs more than it saves), `max` (never) or `default`
/// (0: the setting's default).
fn parse_io_size(v: &str) -> Option<u32> {
    match v {
        "max" => return Some(u32::MAX),
        "default" => return Some(0),
        _ => {}
    }
    let n = config_diag::parse_size(v).ok()?;
    (4096..u64::from(u32::MAX)).contains(&n).then_some(n as u32)
}

/// `reload`: re-read the config file; only `[qos]` changes take effect
/// (the rest needs a restart, and is reported).
fn control_reload(vol: &Volume) -> String {
    let c = match VolumeConfig::load(&vol.config.path) {
        Ok(c) => c,
        Err(e) => return format!("error: {e}\n"),
    };
    let q = &vol.qos;
    let at_start = startup_only_changes(&q.settings(), &c.qos);
    q.apply(q.now(Instant::now()), &c.qos);
    let mut old = vol.config.clone();
    old.qos = c.qos;
    let line = format_settings(&c.qos);
    log::warn!("volume {}: qos reloaded: {line}", vol.config.name);
    let mut reply = format!("{line}\n");
    if !at_start.is_empty() {
        reply += &format!(
            "note: {} change(s) take effect at the next start (the gates are built with them)\n",
            at_start.join(", ")
        );
    }
    if old != c {
        reply += "note: changes outside [qos] need a restart\n";
    }
    reply
}

/// The `[qos]` keys that differ between `old` and `new` but are read only
/// when the volume starts: the estimate's shape, which each queue's gate
/// is built with.
fn startup_only_changes(
    old: &ublk_target::qos::QosConfig,
    new: &ublk_target::qos::QosConfig,
) -> Vec<&'static str> {
    [
        ("qos.estimate_gain", old.estimate_gain != new.estimate_gain),
        (
            "qos.estimate_gain_max",
            old.estimate_gain_max != new.estimate_gain_max,
        ),
        (
            "qos.estimate_base_window_ms",
            old.estimate_base_window_ms != new.estimate_base_window_ms,
        ),
        (
            "qos.estimate_neighbours",
            old.estimate_neighbours != new.estimate_neighbours,
        ),
        (
            "qos.initial_window",
            old.initial_window != new.initial_window,
        ),
        ("qos.max_window", old.max_window != new.max_window),
    ]
    .into_iter()
    .filter_map(|(k, changed)| changed.then_some(k))
    .collect()
}

fn format_settings(c: &ublk_target::qos::QosConfig) -> String {
    let l = &c.limits;
    format!(
        "credits={} riops={} wiops={} rbps={} wbps={} riops_burst={} wiops_burst={} rbps_burst={} wbps_burst={}",
        ublk_target::qos::mode_name(c.credits),
        l.read_iops,
        l.write_iops,
        l.read_bps,
        l.write_bps,
        l.read_iops_burst,
        l.write_iops_burst,
        l.read_bps_burst,
        l.write_bps_burst
    )
}

/// `set NAME key=value...`.
pub fn set(name: &str, settings: &[String]) -> anyhow::Result<()> {
    let reply = state::request(
        &state::run_dir(),
        name,
        &format!("set {}", settings.join(" ")),
    )?;
    if let Some(e) = reply.strip_prefix("error: ") {
        bail!("{}", e.trim_end());
    }
    print!("{reply}");
    Ok(())
}

/// `reload NAME`.
pub fn reload(name: &str) -> anyhow::Result<()> {
    let reply = state::request(&state::run_dir(), name, "reload")?;
    if let Some(e) = reply.strip_prefix("error: ") {
        bail!("{}", e.trim_end());
    }
    print!("{reply}");
    Ok(())
}

fn format_status(s: &ublk_target::volume::StatsSnapshot) -> String {
    let q = &s.qos;
    let credit = q
        .target_credit
        .map_or_else(|| "none".to_owned(), |c| c.to_string());
    let estimate = if q.window_source == "estimate" && q.estimate_bandwidth_bps > 0 {
        format!(
            ": {:.1} MiB/s x {} us base, gain {:.1}, probes kept up {}/{} down {}/{}, {} undecided{}{}",
            q.estimate_bandwidth_bps as f64 / f64::from(1 << 20),
            q.estimate_base_us,
            q.estimate_gain_x100 as f64 / 100.0,
            q.estimate_probes_up_kept,
            q.estimate_probes_up,
            q.estimate_probes_down_kept,
            q.estimate_probes_down,
            q.estimate_probes_undecided,
            if q.estimate_young { ", young" } else { "" },
            if q.estimate_neighbours > 0 {
                format!(
                    ", {} neighbours (last probe cost them {:+.3})",
                    q.estimate_neighbours,
                    q.estimate_neighbour_cost_x1000 as f64 / 1000.0
                )
            } else {
                String::new()
            }
        )
    } else {
        String::new()
    };
    let limit = |n: u64| {
        if n == 0 {
            "max".to_owned()
        } else {
            n.to_string()
        }
    };
    format_counters(s)
        + &format!(
            "  qos: credits {} (window {} from {}{estimate}, target credit {credit}), in flight {} (max {}, over credit {})\n               qos: local queue {} (max {}), waited {} of {} (mean {} us, max {} us, total {} us), limiter delays {}, credit waits {}\n               qos: riops {} wiops {} rbps {} wbps {}\n{}",
            q.credits_mode,
            q.window,
            q.window_source,
            q.in_flight,
            q.in_flight_max,
            q.over_credit,
            q.queued,
            q.queued_max,
            q.waited,
            q.admitted,
            q.wait_us_mean,
            q.wait_us_max,
            q.wait_us_total,
            q.limiter_delays,
            q.credit_waits,
            limit(q.riops),
            limit(q.wiops),
            limit(q.rbps),
            limit(q.wbps),
            format_priority(&s.priority)
        )
        + &format_replicas(s)
        + &format_cluster(s)
        + &format_evol(s)
}

/// An eVol's line: members, map, allocations and the writes that wait for
/// one (a first write waits while no arbiter answers: visible here).
fn format_evol(s: &ublk_target::volume::StatsSnapshot) -> String {
    let Some(e) = &s.evol else {
        return String::new();
    };
    let mut out = format!(
        "  evol {}: {} members, {} extents mapped, {} allocations, {} stale copies\n",
        e.name, e.members, e.extents_mapped, e.allocations, e.stale_copies
    );
    if e.writes_waiting > 0 {
        out += &format!(
            "  evol: {} writes wait for an extent mapping (oldest {} ms)\n",
            e.writes_waiting, e.oldest_wait_ms
        );
    }
    if let Some(f) = &e.flint {
        let auction = match (&f.auction_note, f.auction_enforced) {
            (_, true) => "enforced".to_owned(),
            (Some(why), false) => format!("not enforced ({why})"),
            (None, false) => "not enforced".to_owned(),
        };
        out += &format!(
            "  evol auction: {auction}, {} slices granted, {} waits; view: {} reports ({} vectors accepted), {} arbiter errors, {} victim members\n",
            f.slices_granted, f.slice_waits, f.reports, f.vectors_accepted, f.agent_errors, f.victim_members
        );
    }
    out
}

fn format_cluster(s: &ublk_target::volume::StatsSnapshot) -> String {
    let Some(c) = &s.cluster else {
        return String::new();
    };
    let mut out = format!(
        "  cluster: owner {} epoch {}, lease {} s left, etcd {} ({}), health generation {}\n",
        c.owner,
        c.epoch,
        c.lease_ttl_left_s,
        if c.etcd_reachable {
            "reachable"
        } else {
            "unreachable"
        },
        c.endpoints,
        c.health_generation
    );
    if let Some(e) = &c.etcd_error {
        out += &format!("  cluster: etcd error: {e}\n");
    }
    if let Some(p) = &c.pending_change {
        out += &format!("  cluster: pending: {p}\n");
    }
    if c.writes_waiting > 0 {
        out += &format!(
            "  cluster: {} writes held until etcd records the change\n",
            c.writes_waiting
        );
    }
    if let Some(f) = &c.fenced {
        out += &format!("  cluster: FENCED: {f}\n");
    }
    out
}

fn format_replicas(s: &ublk_target::volume::StatsSnapshot) -> String {
    let mut out = String::new();
    for (i, r) in s.replicas.iter().enumerate() {
        out += &format!(
            "  replica {i}: {} {} ({}), reads {}, dirty regions {}, window {}, in flight {}, credit {}",
            r.target,
            r.status.state,
            if r.connected {
                "connected"
            } else {
                "disconnected"
            },
            r.reads,
            r.status.dirty_regions,
            r.qos.window,
            r.qos.in_flight,
            r.qos
                .target_credit
                .map_or_else(|| "none".to_owned(), |c| c.to_string())
        );
        if r.status.state == "resyncing" {
            out += &format!(", resync {}", format_resync(&r.status));
        }
        out += "\n";
    }
    out
}

/// `copied 12.0 MiB (40%), 30 regions left, about 1m05s left`.
fn format_resync(s: &ublk_target::replication::ReplicaStatus) -> String {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let total = s.resync_bytes + s.resync_bytes_left;
    let pct = if total > 0 {
        format!(" ({:.0}%)", 100.0 * s.resync_bytes as f64 / total as f64)
    } else {
        String::new()
    };
    let eta = match s.resync_seconds_left {
        Some(t) if t >= 3600 => format!("about {}h{:02}m left", t / 3600, t % 3600 / 60),
        Some(t) => format!("about {}m{:02}s left", t / 60, t % 60),
        None => "time left unknown".into(),
    };
    format!(
        "copied {:.1} MiB{pct}, {} regions left, {eta}",
        mib(s.resync_bytes),
        s.resync_regions_left
    )
}

fn format_priority(p: &ublk_target::volume::PrioritySnapshot) -> String {
    let mut out = format!(
        "  priority: {} ({}), queues per ublk queue: {}\n",
        p.mode,
        p.arbitration,
        p.queues.join(" ")
    );
    for c in p
        .classes
        .iter()
        .filter(|c| c.ios + c.admitted + c.queued > 0)
    {
        out += &format!(
            "  class {}: ios {} ({} bytes), admitted {}, queued {}\n",
            c.class, c.ios, c.bytes, c.admitted, c.queued
        );
    }
    out
}

fn format_counters(s: &ublk_target::volume::StatsSnapshot) -> String {
    format!(
        "volume {}: {} -> {} {} ({})\n  reads {} ({} bytes), writes {} ({} bytes), flushes {}, discards {}\n  \
         errors {}, in flight {}, queue failures {}, controller resets {}, sends {} ({} bytes spliced), receives {} ({} direct, {} waited)\n{}",
        s.volume,
        s.device,
        s.target,
        s.subnqn,
        if s.connected { "connected" } else { "reconnecting" },
        s.reads,
        s.read_bytes,
        s.writes,
        s.write_bytes,
        s.flushes,
        s.discards,
        s.errors,
        s.inflight,
        s.queue_failures,
        s.controller_resets,
        s.sends,
        s.spliced_bytes,
        s.receives,
        s.direct_receives,
        s.waited_receives,
        if s.zero_copy.on {
            format!(
                "  zero copy: on, read bytes {} direct, {} copied; write bytes {} direct\n",
                s.zero_copy.read_direct_bytes,
                s.zero_copy.read_copied_bytes,
                s.zero_copy.write_direct_bytes
            )
        } else {
            "  zero copy: off\n".to_owned()
        }
    )
}

/// `demo`: a gimbal-target child process with a RAM namespace on loopback
/// and a device over it, until Ctrl-C (then the device is removed and the
/// target stopped).
pub fn demo(size: &str) -> anyhow::Result<()> {
    ublk::check_available()?;
    config_diag::parse_size(size).map_err(|e| anyhow!("--size: {e}"))?;
    let nqn = "nqn.2026-01.io.gimbal:ublk-nvmf-demo";
    let target = DemoTarget::start(nqn, size).context("starting the demo target")?;
    let addr = target.addr();
    eprintln!("demo: gimbal-target (RAM, {size}) on {addr}, subsystem {nqn}");
    let vtext = format!(
        "name = \"demo\"\n[target]\naddress = \"{}\"\nport = {}\nsubnqn = \"{nqn}\"\n\
         [io]\nqueues = 1\nqueue_depth = 64\n[reconnect]\nreconnect_delay = 1\n",
        addr.ip(),
        addr.port()
    );
    let mut vcfg = VolumeConfig::parse(Path::new("<demo>"), &vtext)?;
    vcfg.host = Some(nvmf_initiator::blocking::HostIdentity::random());
    eprintln!("demo: serving until Ctrl-C");
    let r = run(vcfg, true, false);
    drop(target);
    r
}

/// Start `run --config` in the background; return once the device is live.
fn spawn_background(config: &Path, name: &str, takeover: bool) -> anyhow::Result<DeviceState> {
    let dir = state::run_dir();
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let log_path = dir.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).with_context(|| log_path.display().to_string())?;
    let exe = std::env::current_exe().context("own executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("run").arg("--config").arg(config);
    if takeover {
        cmd.arg("--takeover");
    }
    // Its stderr is the log file below, not the journal: keep the
    // timestamps (config_diag::logging::init_logging).
    cmd.env_remove("JOURNAL_STREAM")
        .env_remove("INVOCATION_ID")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid in the child before exec detaches it from our
    // terminal and session (no signals from the caller's Ctrl-C).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the server")?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(st) = state::load(&dir, name)?.filter(|s| s.pid == pid) {
            if state::request(&dir, name, "ping").is_ok() {
                return Ok(st);
            }
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = text
                .lines()
                .rev()
                .find(|l| l.contains("error"))
                .unwrap_or("")
                .trim()
                .trim_start_matches("ublk-nvmf: error: ")
                .to_owned();
            bail!(
                "the server exited ({status}): {last} (log: {})",
                log_path.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the server did not bring {name} up within 120 s (log: {})",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `add --config FILE`.
pub fn add(config: &Path, takeover: bool) -> anyhow::Result<()> {
    ublk::check_available()?;
    let c = VolumeConfig::load(config)?;
    if takeover && c.cluster.is_none() {
        bail!(
            "{}: --takeover needs [cluster] (ownership lives in etcd); without it a volume has no owner to take over from",
            config.display()
        );
    }
    let st = spawn_background(config, &c.name, takeover)?;
    println!("{}", st.device());
    Ok(())
}

/// `add -t tcp -a ADDR -n NQN ...`: write the volume file the options
/// imply to `dir` (checked first; an existing file with other settings is
/// left alone and refused), then `add` it. A failed add removes the file
/// it wrote, so a corrected retry starts clean.
pub fn add_connect(args: &ConnectArgs, dir: &Path) -> anyhow::Result<()> {
    ublk::check_available()?;
    let text = args.to_toml().map_err(|e| anyhow!(e))?;
    let path = dir.join(format!("{}.toml", args.volume_name()));
    VolumeConfig::parse(&path, &text)?;
    let wrote = match std::fs::read_to_string(&path) {
        Ok(old) if old == text => false,
        Ok(_) => bail!(
            "{} exists with other settings; remove it, or use `ublk-nvmf add --config {}`",
            path.display(),
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            // 0600: the file may hold DH-HMAC-CHAP secrets.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("writing {}", path.display()))?;
            f.write_all(text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            true
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let r = add(&path, false);
    if r.is_err() && wrote {
        let _ = std::fs::remove_file(&path);
    }
    r
}

/// `recover NAME`: reattach a quiesced device left by a server that died.
pub fn recover(name: &str) -> anyhow::Result<()> {
    ublk::check_available()?;
    let dir = state::run_dir();
    let st = state::load(&dir, name)?
        .ok_or_else(|| anyhow!("no saved state for volume {name} in {}", dir.display()))?;
    match ublk::device_state(st.dev_id) {
        Some(DevState::Quiesced) => {}
        Some(s) => bail!(
            "{} is {s:?}, not waiting for recovery (is its server still running?)",
            st.device()
        ),
        None => bail!("{} no longer exists", st.device()),
    }
    let new = spawn_background(&st.config, name, false)?;
    if new.dev_id != st.dev_id {
        bail!("recovered onto {}, expected {}", new.device(), st.device());
    }
    println!("{}", new.device());
    Ok(())
}

/// `del NAME`: stop the server and delete the device.
pub fn del(name: &str) -> anyhow::Result<()> {
    let dir = state::run_dir();
    let st = state::load(&dir, name)?;
    match state::request(&dir, name, "stop") {
        Ok(_) => {
            let deadline = Instant::now() + Duration::from_secs(30);
            while state::load(&dir, name)?.is_some() {
                if Instant::now() > deadline {
                    bail!("volume {name} did not stop within 30 s");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        }
        Err(e) => match st {
            Some(st) => {
                if ublk::device_state(st.dev_id).is_some() {
                    ublk::delete_device(st.dev_id)?;
                }
                state::remove(&dir, name);
                Ok(())
            }
            None => Err(e.into()),
        },
    }
}

/// `list`.
pub fn list(json: bool) -> anyhow::Result<()> {
    let states = state::list(&state::run_dir());
    if json {
        println!("{}", list_json(&states, pid_alive));
        return Ok(());
    }
    print!("{}", list_table(&states, pid_alive, config_targets));
    Ok(())
}

/// The `address:port` of every target (replica) in a volume's config
/// file, comma-separated; `-` when the file cannot be read any more.
fn config_targets(s: &DeviceState) -> String {
    match VolumeConfig::load(&s.config) {
        Ok(c) => c
            .replicas
            .iter()
            .map(|t| format!("{}:{}", t.address, t.port))
            .collect::<Vec<_>>()
            .join(","),
        Err(_) => "-".into(),
    }
}

/// `list` as `nvme list` reads: one line per device, columns aligned to
/// their widest cell, the device node first. Every cell but the last two
/// is one word, so `awk '$2 == "vol0" {print $1}'` finds a device; `PID`
/// is `dead` for a device whose server is gone (`ublk-nvmf recover`).
fn list_table(
    states: &[DeviceState],
    alive: impl Fn(u32) -> bool,
    targets: impl Fn(&DeviceState) -> String,
) -> String {
    let header = [
        "Node", "Name", "PID", "Target", "SubNQN", "NSID", "Usage", "Format",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for s in states {
        let g = &s.target.geometry;
        rows.push(vec![
            s.device(),
            s.volume.clone(),
            if alive(s.pid) {
                s.pid.to_string()
            } else {
                "dead".into()
            },
            targets(s),
            s.target.subnqn.clone(),
            g.nsid.to_string(),
            human_bytes(g.blocks * u64::from(g.block_size)),
            format!("{} B", g.block_size),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out += line.join("  ").trim_end();
        out.push('\n');
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out += &rule.join("  ");
            out.push('\n');
        }
    }
    out
}

/// Bytes in binary units with two decimals, as `nvme list` prints sizes
/// (it uses decimal units; ublk sizes are set in binary ones).
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// `list --json`, schema 1 (docs/architecture.md): fields are only ever
/// added, and a change to a field's meaning bumps `schema`.
fn list_json(states: &[DeviceState], alive: impl Fn(u32) -> bool) -> String {
    let volumes: Vec<serde_json::Value> = states
        .iter()
        .map(|s| {
            let g = &s.target.geometry;
            serde_json::json!({
                "name": s.volume,
                "device": s.device(),
                "dev_id": s.dev_id,
                "config": s.config,
                "server": { "pid": s.pid, "alive": alive(s.pid) },
                "subnqn": s.target.subnqn,
                "serial": s.target.serial,
                "nguid": s.target.nguid,
                "nsid": g.nsid,
                "block_size": g.block_size,
                "size_bytes": g.blocks * u64::from(g.block_size),
            })
        })
        .collect();
    serde_json::json!({ "schema": 1, "volumes": volumes }).to_string()
}

/// `status NAME [--json]`.
pub fn status(name: &str, json: bool) -> anyhow::Result<()> {
    let reply = state::request(
        &state::run_dir(),
        name,
        if json { "status-json" } else { "status" },
    )?;
    print!("{reply}");
    Ok(())
}

/// `udev-name KERNEL`: the volume name for a kernel device name.
pub fn udev_name(kernel: &str) -> anyhow::Result<()> {
    let states = state::list(&state::run_dir());
    match state::volume_for_kernel_name(&states, kernel) {
        Some(v) => {
            println!("{v}");
            Ok(())
        }
        None => bail!("{kernel} is not a ublk-nvmf device"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ublk_target::io::mapping::Geometry;
    use ublk_target::volume::TargetIdentity;

    /// `reload` says which `[qos]` changes wait for a restart: the
    /// estimate's shape is built into each queue's gate; limits and the
    /// credit mode apply at once.
    #[test]
    fn reload_names_the_qos_keys_read_only_at_start() {
        use ublk_target::qos::{apply_settings, QosConfig};
        let old = QosConfig::new();
        let limits = apply_settings(&old, &["riops=100", "credits=off"]).unwrap();
        assert!(startup_only_changes(&old, &limits).is_empty());
        let new = QosConfig {
            estimate_gain: 3.0,
            estimate_neighbours: false,
            ..old
        };
        assert_eq!(
            startup_only_changes(&old, &new),
            ["qos.estimate_gain", "qos.estimate_neighbours"]
        );
    }

    fn state(volume: &str, dev_id: u32, pid: u32, gib: u64) -> DeviceState {
        DeviceState {
            volume: volume.into(),
            config: format!("/etc/ublk-nvmf/{volume}.toml").into(),
            dev_id,
            pid,
            target: TargetIdentity {
                subnqn: "nqn.2026-01.io.gimbal:demo".into(),
                serial: "S1".into(),
                nguid: "00".repeat(16),
                geometry: Geometry {
                    nsid: 1,
                    block_size: 512,
                    blocks: gib << 21,
                    max_io_bytes: 1 << 20,
                    volatile_cache: false,
                    discard: true,
                    write_zeroes: true,
                },
            },
        }
    }

    #[test]
    fn io_settings_take_a_size_from_4k_max_or_default() {
        assert_eq!(parse_io_size("32k"), Some(32 * 1024));
        assert_eq!(parse_io_size("4096"), Some(4096));
        assert_eq!(parse_io_size("1M"), Some(1 << 20));
        assert_eq!(parse_io_size("max"), Some(u32::MAX));
        assert_eq!(parse_io_size("default"), Some(0));
        for bad in ["", "0", "512", "4095", "8g", "lots", "-4k"] {
            assert_eq!(parse_io_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn list_is_a_table_like_nvme_list() {
        let states = [
            state("vol0", 0, 812, 1),
            state("mirror-long-name", 12, 999, 2048),
        ];
        let t = list_table(
            &states,
            |pid| pid == 812,
            |s| {
                if s.volume == "vol0" {
                    "127.0.0.1:4420".into()
                } else {
                    "10.0.0.1:4420,10.0.0.2:4420".into()
                }
            },
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[0].starts_with("Node          Name              PID   Target"),
            "{t}"
        );
        assert!(
            lines[1].starts_with("------------  ----------------  ----  ---"),
            "{t}"
        );
        assert!(
            lines[2].starts_with("/dev/ublkb0   vol0              812   127.0.0.1:4420 "),
            "{t}"
        );
        assert!(lines[2].ends_with("  1     1.00 GiB  512 B"), "{t}");
        assert!(
            lines[3]
                .starts_with("/dev/ublkb12  mirror-long-name  dead  10.0.0.1:4420,10.0.0.2:4420"),
            "{t}"
        );
        assert!(lines[3].ends_with("2.00 TiB  512 B"), "{t}");
        // Every column starts at the same place on every line.
        let col = |l: &str, word: &str| l.find(word).unwrap();
        assert_eq!(col(lines[0], "SubNQN"), col(lines[2], "nqn."));
        assert_eq!(col(lines[0], "SubNQN"), col(lines[3], "nqn."));
        // Scripts find a device by name with awk.
        let dev: Vec<&str> = lines
            .iter()
            .filter(|l| l.split_whitespace().nth(1) == Some("vol0"))
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(dev, ["/dev/ublkb0"]);
    }

    #[test]
    fn an_empty_list_is_the_header() {
        let t = list_table(&[], |_| true, |_| String::new());
        assert_eq!(t.lines().count(), 2);
        assert!(t.starts_with("Node  Name  PID  Target  SubNQN  NSID  Usage  Format\n"));
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(256 << 20), "256.00 MiB");
        assert_eq!(human_bytes(1536 << 30), "1.50 TiB");
    }

    #[test]
    fn list_json_is_schema_1() {
        let j: serde_json::Value =
            serde_json::from_str(&list_json(&[state("vol0", 0, 812, 1)], |_| true)).unwrap();
        assert_eq!(j["schema"], 1);
        assert_eq!(j["volumes"][0]["device"], "/dev/ublkb0");
        assert_eq!(j["volumes"][0]["size_bytes"], 1u64 << 30);
    }
}
