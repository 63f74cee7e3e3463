//! Listening sockets, connection tasks and orderly shutdown.
//!
//! Two ways in: [`run`] serves in the foreground until SIGTERM or SIGINT
//! (the `gimbal-target run` command and its systemd unit), [`spawn`] starts
//! a target on background threads and returns a handle (tests, benchmarks
//! and `ublk-nvmf demo`).
//!
//! Shutdown is orderly: listeners close, every connection stops reading new
//! commands, waits (bounded) for the commands it already accepted to
//! complete and be sent, then closes; finally every backend is flushed, so
//! an acknowledged write is durable once the process exits.
//!
//! Shutdown is bounded whatever hosts do: connections get
//! `timeouts.shutdown_ms` (default 10 s) in all to finish; a host that does
//! not read its socket cannot stretch that (its sends time out, and what is
//! left is dropped with the runtime). Then the backends flush, and the
//! runtime gets [`RUNTIME_STOP`] to end its threads. So SIGTERM ends the
//! process within `shutdown_ms` + the backends' flush + 1 s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::config::TargetConfig;
use crate::frontend::target::Target;
use crate::limited;

/// How long a stopped runtime waits for its tasks and blocking threads
/// (anything still running after the shutdown grace) before it is left
/// behind.
pub const RUNTIME_STOP: std::time::Duration = std::time::Duration::from_secs(1);

/// A target running on background threads. Dropping it shuts it down.
#[derive(Debug)]
pub struct TargetHandle {
    target: Arc<Target>,
    addrs: Vec<SocketAddr>,
    thread: Option<JoinHandle<()>>,
    metrics: Option<prom_exposition::MetricsServer>,
}

impl TargetHandle {
    /// The addresses the target listens on (with ephemeral ports resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.addrs.clone()
    }

    /// Where `GET /metrics` is served, when the config asked for it
    /// (`[metrics] listen`; port 0 resolved).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.local_addr())
    }

    /// The shared target state (controllers, subsystems).
    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// Shuts down in order (see the module docs) and waits for it.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.metrics = None;
        self.target.shutdown.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TargetHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(8),
        )
        .thread_name("gimbal-target")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn bind(target: &Target) -> anyhow::Result<Vec<TcpListener>> {
    let mut listeners = Vec::new();
    let mut addrs = Vec::new();
    for addr in &target.config.listen {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        addrs.push(l.local_addr()?);
        listeners.push(l);
    }
    *target
        .listen_addrs
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = addrs;
    Ok(listeners)
}

/// Accepts connections until shutdown, then drains them and flushes
/// backends.
async fn serve(target: Arc<Target>, listeners: Vec<TcpListener>) -> std::io::Result<()> {
    let tracker = TaskTracker::new();
    for l in listeners {
        let (target, tracker2) = (target.clone(), tracker.clone());
        tracker.spawn(async move {
            loop {
                tokio::select! {
                    r = l.accept() => match r {
                        Ok((stream, peer)) => {
                            use std::sync::atomic::Ordering;
                            target.connections_accepted.fetch_add(1, Ordering::Relaxed);
                            let max = target.config.limits.max_connections as usize;
                            if target.connections_live.fetch_add(1, Ordering::AcqRel) >= max {
                                target.connections_live.fetch_sub(1, Ordering::AcqRel);
                                limited!(
                                    target.log_limiter,
                                    log::Level::Warn,
                                    "too-many-connections",
                                    "{peer}: refused: {max} connections already (limits.max_connections)"
                                );
                                drop(stream);
                                continue;
                            }
                            let t = target.clone();
                            tracker2.spawn(async move {
                                crate::frontend::connection::serve(stream, t.clone()).await;
                                t.connections_live.fetch_sub(1, Ordering::AcqRel);
                            });
                        }
                        // Out of file descriptors and the like: back off
                        // rather than spin.
                        Err(e) => {
                            limited!(
                                target.log_limiter,
                                log::Level::Warn,
                                "accept",
                                "accept failed: {e}"
                            );
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    },
                    _ = target.shutdown.cancelled() => return,
                }
            }
        });
    }
    target.shutdown.cancelled().await;
    tracker.close();
    let grace = std::time::Duration::from_millis(target.config.timeouts.shutdown_ms.into());
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        log::warn!(
            "{} connection(s) still open {grace:?} after shutdown began: dropping them",
            target
                .connections_live
                .load(std::sync::atomic::Ordering::Acquire)
        );
    }
    let t = target.clone();
    tokio::task::spawn_blocking(move || t.flush_all())
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Starts a target on background threads.
pub fn spawn(config: TargetConfig) -> anyhow::Result<TargetHandle> {
    let target = Arc::new(Target::new(config)?);
    let rt = runtime()?;
    let listeners = rt.block_on(bind(&target))?;
    let metrics = start_metrics(&target)?;
    let addrs = target
        .listen_addrs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let t = target.clone();
    let thread = std::thread::Builder::new()
        .name("gimbal-target-main".into())
        .spawn(move || {
            if let Err(e) = rt.block_on(serve(t, listeners)) {
                log::error!("flushing backends at shutdown: {e}");
            }
            rt.shutdown_timeout(RUNTIME_STOP);
        })?;
    Ok(TargetHandle {
        target,
        addrs,
        thread: Some(thread),
        metrics,
    })
}

/// The metrics responder, if `[metrics] listen` asks for one.
fn start_metrics(target: &Arc<Target>) -> anyhow::Result<Option<prom_exposition::MetricsServer>> {
    let Some(addr) = target.config.metrics_listen else {
        return Ok(None);
    };
    let m = crate::metrics::serve(target.clone(), addr)
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    Ok(Some(m))
}

/// Serves in the foreground until SIGTERM or SIGINT. Returns an error if
/// the target cannot start or a backend fails to flush at shutdown.
pub fn run(config: TargetConfig) -> anyhow::Result<()> {
    run_with_status(config, None)
}

/// [`run`], logging the virtual view of every Gimbal namespace
/// ([`Target::gimbal_status_lines`]) every `status_every`, at info level.
pub fn run_with_status(
    config: TargetConfig,
    status_every: Option<std::time::Duration>,
) -> anyhow::Result<()> {
    let target = Arc::new(Target::new(config)?);
    let rt = runtime()?;
    let result = rt.block_on(async {
        let listeners = bind(&target).await?;
        for a in target
            .listen_addrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            log::info!("listening on {a}");
        }
        let metrics = start_metrics(&target)?;
        if let Some(m) = &metrics {
            log::info!("metrics on http://{}/metrics", m.local_addr());
        }
        for s in target.subsystems.values() {
            for n in s.namespaces.values() {
                log::info!(
                    "{} namespace {}: {} backend, {} blocks of {} bytes, qos {:?}",
                    s.nqn(),
                    n.nsid,
                    n.config.backend.kind(),
                    n.size_blocks,
                    n.block_size,
                    n.config.qos
                );
            }
        }
        if let Some(every) = status_every.filter(|d| !d.is_zero()) {
            let t = target.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = t.shutdown.cancelled() => break,
                    }
                    for line in t.gimbal_status_lines() {
                        log::info!("{line}");
                    }
                }
            });
        }
        let t = target.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
            tokio::select! {
                _ = term.recv() => log::info!("SIGTERM: shutting down"),
                _ = int.recv() => log::info!("SIGINT: shutting down"),
            }
            t.shutdown.cancel();
        });
        serve(target.clone(), listeners)
            .await
            .context("flushing backends at shutdown")?;
        drop(metrics);
        log::info!("stopped");
        Ok(())
    });
    rt.shutdown_timeout(RUNTIME_STOP);
    result
}
