//! Following an eVol's extent map as it changes (issue 18): the client
//! caches the map ([`crate::evol`]) and must see mappings made by anyone
//! else (an arbiter answering another request, another host that owned
//! the volume before, an operator's tool) without asking etcd per I/O.
//!
//! [`Store::read_extents_at`] reads the map *and* the revision it was read
//! at; [`ExtentWatch`] then follows the extent prefix from the next
//! revision on a thread of its own, so no change between the read and the
//! watch is missed (etcd replays history from a revision). When etcd has
//! compacted that history (the watch was down too long), the watch reads
//! the whole map again and hands it over as [`ExtentEvent::Resync`]: the
//! cache replaces its contents instead of missing an event.
//!
//! The thread has its own runtime and client (the [`Store`] is not
//! `Sync`, and a watch holds a stream open for the volume's lifetime); a
//! broken stream is re-established from the last revision seen, every
//! endpoint in turn.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, GetOptions, WatchOptions};

use crate::evol::{EvolKeys, ExtentRecord};
use crate::store::{decode, Store, StoreConfig, StoreError};

/// An eVol's extent map as read at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtentSnapshot {
    /// Every mapped extent, in index order.
    pub extents: Vec<ExtentRecord>,
    /// The revision it was read at: a watch continues at `revision + 1`.
    pub revision: i64,
}

/// A change of the extent map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtentEvent {
    /// An extent was mapped (or its record rewritten).
    Mapped(ExtentRecord),
    /// Extent `index`'s record was deleted (unmapped).
    Unmapped(u64),
    /// The history since the last event is gone (compacted): this is the
    /// whole map now; forget anything not in it.
    Resync(ExtentSnapshot),
}

impl Store {
    /// Reads eVol `name`'s extent map and the revision it was read at
    /// (what [`ExtentWatch::start`] continues from).
    pub fn read_extents_at(
        &self,
        keys: &EvolKeys,
        name: &str,
    ) -> Result<ExtentSnapshot, StoreError> {
        let prefix = keys.extents(name);
        let resp = self.get(&prefix, Some(GetOptions::new().with_prefix()))?;
        snapshot_of(&prefix, &resp)
    }
}

fn snapshot_of(
    prefix: &str,
    resp: &etcd_client::GetResponse,
) -> Result<ExtentSnapshot, StoreError> {
    let extents = resp
        .kvs()
        .iter()
        .map(|kv| decode(kv.value()).map_err(|e| bad(prefix, e)))
        .collect::<Result<_, _>>()?;
    Ok(ExtentSnapshot {
        extents,
        revision: resp.header().map_or(0, |h| h.revision()),
    })
}

fn bad(key: &str, reason: String) -> StoreError {
    StoreError::BadRecord {
        volume: String::new(),
        key: key.to_owned(),
        reason,
    }
}

/// The logical index a key under the extent prefix names.
fn index_of(prefix: &str, key: &[u8]) -> Option<u64> {
    std::str::from_utf8(key)
        .ok()?
        .strip_prefix(prefix)?
        .parse()
        .ok()
}

/// How long the thread waits between attempts when etcd cannot be
/// reached (it also looks at its stop flag at least this often).
const RETRY: Duration = Duration::from_millis(500);

/// A running watch of one eVol's extents; stopped when dropped.
pub struct ExtentWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ExtentWatch {
    /// Follows eVol `name`'s extents from `revision + 1` (the revision of
    /// the [`ExtentSnapshot`] the caller cached), calling `on_event` for
    /// every change, in revision order, on the watch's own thread.
    /// Records that do not decode are logged and skipped (a newer schema:
    /// the cache keeps what it has rather than guessing).
    pub fn start(
        config: StoreConfig,
        keys: &EvolKeys,
        name: &str,
        revision: i64,
        on_event: impl FnMut(ExtentEvent) + Send + 'static,
    ) -> Result<Self, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::Unreachable {
                endpoints: String::new(),
                reason: "no endpoints".into(),
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let prefix = keys.extents(name);
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("evol-watch-{name}"))
            .spawn(move || run(config, prefix, revision + 1, s, on_event))
            .map_err(|e| StoreError::Unreachable {
                endpoints: String::new(),
                reason: format!("cannot start the watch thread: {e}"),
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the watch and waits for its thread (at most about
    /// `RETRY` plus one operation timeout).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ExtentWatch {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(
    config: StoreConfig,
    prefix: String,
    mut next: i64,
    stop: Arc<AtomicBool>,
    mut on_event: impl FnMut(ExtentEvent),
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error!(
                "extent watch {prefix}: cannot start a runtime: {e}; the map is not followed"
            );
            return;
        }
    };
    let mut ep = 0usize;
    while !stop.load(Ordering::Acquire) {
        let endpoint = config.endpoints[ep % config.endpoints.len()].clone();
        ep += 1;
        let r = rt.block_on(follow(
            &config,
            &endpoint,
            &prefix,
            &mut next,
            &stop,
            &mut on_event,
        ));
        if let Err(e) = r {
            log::warn!(
                "extent watch {prefix} on {endpoint}: {e}; watching again from revision {next}"
            );
            std::thread::sleep(RETRY);
        }
    }
}

/// One watch stream on `endpoint`, until it breaks (Err) or `stop`.
async fn follow(
    config: &StoreConfig,
    endpoint: &str,
    prefix: &str,
    next: &mut i64,
    stop: &AtomicBool,
    on_event: &mut impl FnMut(ExtentEvent),
) -> Result<(), String> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(config.op_timeout)
        .with_timeout(config.op_timeout)
        .with_require_leader(true);
    let mut client =
        tokio::time::timeout(config.op_timeout, Client::connect([endpoint], Some(opts)))
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| e.to_string())?;
    let mut stream = client
        .watch(
            prefix,
            Some(WatchOptions::new().with_prefix().with_start_revision(*next)),
        )
        .await
        .map_err(|e| e.to_string())?;
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let msg = match tokio::time::timeout(RETRY, stream.message()).await {
            Err(_) => continue, // quiet: look at the stop flag again
            Ok(r) => r.map_err(|e| e.to_string())?,
        };
        let Some(resp) = msg else {
            return Err("the watch stream ended".into());
        };
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                // The history from `next` is gone: start over from a full
                // read, and watch from its revision.
                let got = client
                    .get(prefix, Some(GetOptions::new().with_prefix()))
                    .await
                    .map_err(|e| e.to_string())?;
                let snap = snapshot_of(prefix, &got).map_err(|e| e.to_string())?;
                *next = snap.revision + 1;
                on_event(ExtentEvent::Resync(snap));
                return Err(format!(
                    "history compacted at revision {}; read the whole map again",
                    resp.compact_revision()
                ));
            }
            return Err(format!("watch canceled: {}", resp.cancel_reason()));
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            *next = (*next).max(kv.mod_revision() + 1);
            match ev.event_type() {
                EventType::Put => match decode::<ExtentRecord>(kv.value()) {
                    Ok(rec) => on_event(ExtentEvent::Mapped(rec)),
                    Err(e) => log::error!(
                        "extent watch: {}: {e}; ignored",
                        String::from_utf8_lossy(kv.key())
                    ),
                },
                EventType::Delete => {
                    if let Some(i) = index_of(prefix, kv.key()) {
                        on_event(ExtentEvent::Unmapped(i));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extent_key_names_its_index() {
        let k = EvolKeys::new("/p");
        let prefix = k.extents("v");
        assert_eq!(index_of(&prefix, k.extent("v", 42).as_bytes()), Some(42));
        assert_eq!(index_of(&prefix, b"/p/evols/w/extents/000000000001"), None);
        assert_eq!(index_of(&prefix, format!("{prefix}x").as_bytes()), None);
    }
}
