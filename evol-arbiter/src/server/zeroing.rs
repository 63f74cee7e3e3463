//! The leader's zeroing task: every physical extent freed by an unmap
//! (its `pext` key a zeroing record, [`cluster_store::evol`] rule 5) is
//! overwritten with zeros over NVMe/TCP, then freed in etcd
//! ([`cluster_store::Store::finish_zeroing`], guarded by the leadership
//! and the record) and in the catalog. Until both are done it stays
//! Zeroing: no allocation takes it, whichever arbiter leads.
//!
//! - One connection per namespace ([`crate::nvme::NsConnection`]: an
//!   `nvmf-initiator` blocking controller with one I/O queue of the Low
//!   class, shared with `check --scan-data`), kept between
//!   extents, dropped on any failure and opened again after a backoff
//!   (0.5 s doubling to 30 s, per namespace).
//! - Write Zeroes (no deallocate hint) when the controller has it (ONCS
//!   bit 3), in commands of at most 65536 blocks; else writes of a zero
//!   buffer; then a Flush, so the zeros are durable before reuse.
//! - One extent per namespace at a time, at most [`MAX_JOBS`] at once.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_store::evol::{NamespaceRecord, PextRecord, Placement, ZeroingOutcome};
use nvmf_initiator::Command;

use super::Shared;
use crate::nvme::NsConnection;

/// Extents zeroed at once, over all namespaces.
pub(super) const MAX_JOBS: usize = 4;

/// Blocks per Write Zeroes command (NLB is 16 bits, 0's based).
const MAX_WZ_BLOCKS: u64 = 65536;

/// Bytes per write when zeroing by writes.
const ZERO_BUF: u64 = 1 << 20;

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A connection to one namespace, for zeroing; whether Write Zeroes
/// works there (ONCS says so and the first command did not refuse it).
pub(super) struct Zeroer {
    conn: NsConnection,
    write_zeroes: bool,
}

impl Zeroer {
    fn connect(record: &NamespaceRecord) -> Result<Self, String> {
        // The system's host identity, as `pool add`'s discovery.
        let conn = NsConnection::connect(record, None)?;
        let write_zeroes = conn.write_zeroes();
        Ok(Zeroer { conn, write_zeroes })
    }

    fn run(
        &mut self,
        command: Command,
        buf: Option<Vec<u8>>,
        what: &'static str,
    ) -> Result<(), nvmf_initiator::Error> {
        self.conn.run(command, buf, what).map(|_| ())
    }

    /// Overwrites physical extent `pext` with zeros, durably.
    fn zero(&mut self, pext: u64) -> Result<(), String> {
        let eb = self.conn.record().extent_bytes;
        let bs = self.conn.block_size();
        let nsid = self.conn.record().nsid;
        let (first, blocks) = self.conn.extent_blocks(pext)?;
        let mut done = 0;
        while self.write_zeroes && done < blocks {
            let n = (blocks - done).min(MAX_WZ_BLOCKS);
            let cmd = Command::WriteZeroes {
                nsid,
                slba: first + done,
                blocks: n as u32,
                deallocate: false,
            };
            match self.run(cmd, None, "Write Zeroes") {
                Ok(()) => done += n,
                Err(nvmf_initiator::Error::CommandFailed { status, .. }) if done == 0 => {
                    // ONCS said yes, the command says no: write zeros.
                    log::warn!(
                        "namespace {}: Write Zeroes failed ({status:?}); zeroing by writes",
                        self.conn.record().id
                    );
                    self.write_zeroes = false;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        if !self.write_zeroes {
            let per = ZERO_BUF.min(eb) / bs;
            let mut at = 0;
            while at < blocks {
                let n = (blocks - at).min(per);
                let cmd = Command::Write {
                    nsid,
                    slba: first + at,
                    block_size: bs as u32,
                    fua: false,
                };
                self.run(cmd, Some(vec![0; (n * bs) as usize]), "Write")
                    .map_err(|e| e.to_string())?;
                at += n;
            }
        }
        self.run(Command::Flush { nsid }, None, "Flush")
            .map_err(|e| e.to_string())
    }
}

/// Per namespace: its connection, whether an extent is being zeroed,
/// and the backoff after failures.
#[derive(Default)]
pub(super) struct Slot {
    conn: Option<Zeroer>,
    busy: bool,
    failures: u32,
    next_try: Option<Instant>,
}

/// The slots of every namespace seen.
pub(super) type Slots = HashMap<String, Slot>;

/// The task (runs until `stop`): starts jobs while this instance leads.
pub(super) async fn run(shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        let notified = shared.zeroing_wake.notified();
        start_jobs(&shared);
        let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
    }
}

fn start_jobs(shared: &Arc<Shared>) {
    let Ok(lead) = shared.leading() else {
        return;
    };
    // Candidates: the lowest waiting extent of each namespace.
    let candidates: Vec<(NamespaceRecord, u64, PextRecord)> = {
        let guard = shared.core.lock().unwrap_or_else(|p| p.into_inner());
        let Some(c) = guard.as_ref().filter(|c| c.lead == lead) else {
            return;
        };
        let mut out: Vec<(NamespaceRecord, u64, PextRecord)> = Vec::new();
        for ((ns, pext), rec) in &c.zeroing {
            if out.last().is_some_and(|(r, _, _)| r.id == *ns) {
                continue;
            }
            if let Some(n) = c.namespaces.get(ns) {
                out.push((n.record.clone(), *pext, rec.clone()));
            }
        }
        out
    };
    let now = Instant::now();
    let mut slots = shared.zeroers.lock().unwrap_or_else(|p| p.into_inner());
    let mut running = slots.values().filter(|s| s.busy).count();
    for (ns, pext, rec) in candidates {
        if running >= MAX_JOBS {
            break;
        }
        let slot = slots.entry(ns.id.clone()).or_default();
        if slot.busy || slot.next_try.is_some_and(|t| now < t) {
            continue;
        }
        slot.busy = true;
        running += 1;
        let conn = slot.conn.take();
        tokio::spawn(job(Arc::clone(shared), lead, ns, pext, rec, conn));
    }
}

async fn job(
    shared: Arc<Shared>,
    lead: cluster_store::evol::Leadership,
    ns: NamespaceRecord,
    pext: u64,
    rec: PextRecord,
    conn: Option<Zeroer>,
) {
    let started = Instant::now();
    // The extent must still wait for zeroing in etcd: a catalog rebuilt
    // from a pool read before this leader freed it would list it again,
    // maybe after it was mapped anew (then zeroing would wipe live data).
    // A zeroing record stays until this task deletes it, one job per
    // namespace: checked here, it holds while the job zeroes.
    let copy = Placement {
        namespace: ns.id.clone(),
        pext,
    };
    let c2 = copy.clone();
    match shared.etcd(move |st, k| st.pext_record(k, &c2)).await {
        Ok(Some(r)) if r == rec => {}
        Ok(found) => {
            let mut guard = shared.core.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = guard.as_mut().filter(|c| c.lead == lead) {
                if found.is_none() {
                    c.zeroed(&ns.id, pext);
                } else {
                    c.zeroing.remove(&(ns.id.clone(), pext));
                }
            }
            drop(guard);
            log::info!(
                "namespace {} physical extent {pext}: no longer waits for zeroing in etcd ({}); skipped",
                ns.id,
                if found.is_none() { "free" } else { "in use" }
            );
            release(&shared, &ns.id, conn, Ok(()), pext);
            return;
        }
        Err(e) => {
            release(
                &shared,
                &ns.id,
                conn,
                Err(format!("etcd: {}", e.message())),
                pext,
            );
            return;
        }
    }
    let nsr = ns.clone();
    let zeroed = tokio::task::spawn_blocking(move || {
        // A connection to a namespace since moved is opened again.
        let conn = conn.filter(|z| *z.conn.record() == nsr);
        let mut z = match conn {
            Some(z) => z,
            None => match Zeroer::connect(&nsr) {
                Ok(z) => z,
                Err(e) => return (None, Err(e)),
            },
        };
        match z.zero(pext) {
            Ok(()) => (Some(z), Ok(())),
            // Drop the connection (here, off the runtime: it joins a thread).
            Err(e) => (None, Err(e)),
        }
    })
    .await
    .unwrap_or_else(|e| (None, Err(format!("zeroing task: {e}"))));
    let (conn, result) = zeroed;
    let result = match result {
        Err(e) => Err(e),
        Ok(()) => {
            let r = rec.clone();
            match shared
                .etcd(move |st, k| st.finish_zeroing(k, lead, &copy, &r))
                .await
            {
                Ok(ZeroingOutcome::Freed) | Ok(ZeroingOutcome::AlreadyFree) => {
                    let mut guard = shared.core.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(c) = guard.as_mut().filter(|c| c.lead == lead) {
                        c.zeroed(&ns.id, pext);
                    }
                    drop(guard);
                    shared.counters.zeroed.fetch_add(1, Ordering::Relaxed);
                    log::info!(
                        "namespace {} physical extent {pext} (freed from eVol {} extent {}) zeroed in {:.0?}; free",
                        ns.id,
                        rec.evol,
                        rec.index,
                        started.elapsed()
                    );
                    Ok(())
                }
                Ok(ZeroingOutcome::Changed) => {
                    log::warn!(
                        "namespace {} physical extent {pext}: its zeroing record changed in etcd; reloading the pool",
                        ns.id
                    );
                    if let Err(e) = shared.reload().await {
                        log::warn!("reloading the pool: {e}");
                    }
                    Ok(())
                }
                Ok(ZeroingOutcome::NotLeader) => {
                    shared.depose("freeing a zeroed extent found another leader");
                    Ok(())
                }
                Err(e) => Err(format!("etcd: {}", e.message())),
            }
        }
    };
    release(&shared, &ns.id, conn, result, pext);
}

/// The job on `ns` ended with `result`: its slot is free again, with the
/// connection kept, or a backoff after a failure.
fn release(shared: &Shared, ns: &str, conn: Option<Zeroer>, result: Result<(), String>, pext: u64) {
    let mut slots = shared.zeroers.lock().unwrap_or_else(|p| p.into_inner());
    let slot = slots.entry(ns.to_owned()).or_default();
    slot.busy = false;
    match result {
        Ok(()) => {
            slot.conn = conn;
            slot.failures = 0;
            slot.next_try = None;
            drop(slots);
            shared.zeroing_wake.notify_one();
        }
        Err(e) => {
            // Keep a connection that works (an etcd failure) unless the
            // zeroing itself failed.
            slot.conn = conn;
            slot.failures = slot.failures.saturating_add(1);
            let backoff = BACKOFF_MIN
                .saturating_mul(1 << slot.failures.min(8).saturating_sub(1))
                .min(BACKOFF_MAX);
            slot.next_try = Some(Instant::now() + backoff);
            shared
                .counters
                .zeroing_failures
                .fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "namespace {ns} physical extent {pext}: zeroing failed ({e}); it stays out of reuse, retry in {backoff:.1?}"
            );
        }
    }
}
