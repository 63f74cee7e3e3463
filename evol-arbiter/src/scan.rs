//! `evol-arbiter check --scan-data`: the issue's "every written extent is
//! mapped", checked against the drives rather than etcd alone.
//!
//! A client writes only extents the arbiter mapped durably (the mapping
//! is in etcd before the answer, [`cluster_store::evol`] rule 4), and a
//! freed extent is zeroed before it is freed (rule 5: its `pext` key stays
//! a zeroing record until then). So a physical extent that is FREE in etcd
//! (no `pext` key: neither mapped nor waiting for zeroing) reads all
//! zeros, or a client wrote through a stale map, or a bug freed a written
//! extent. [`scan_free_extents`] reads every free extent of every
//! namespace of the pool over NVMe/TCP and reports each one that holds
//! data ([`ScanFinding::WrittenButUnmapped`]).
//!
//! - **Connection**: [`crate::nvme::NsConnection`], the zeroing task's
//!   (one I/O queue of the Low class, failing fast), one namespace at a
//!   time, as the host given (default: the system's identity,
//!   `/etc/nvme/hostnqn`, as the zeroing task and `pool add` connect):
//!   a target that allows only listed hosts must list it.
//! - **Reads**: in chunks of at most [`SCAN_CHUNK`] bytes and at most the
//!   controller's maximum transfer (one command each), block multiples,
//!   into one buffer per namespace handed to every read and back (no
//!   allocation per chunk). An extent stops being read at its first
//!   nonzero byte.
//! - **Unreachable namespaces are findings** ([`ScanFinding::Unreachable`]:
//!   a failed connection, or a read that failed): a scan that could not
//!   look does not pass.
//! - **The race**: the free set is the pool as read at one etcd revision;
//!   an extent may be mapped and written after it. Before reporting one,
//!   its `pext` key is read again (a linearizable read, at the current
//!   revision, later than the pool's) and the extent is reported only if
//!   it is still free. Left: an extent mapped, written, unmapped, zeroed
//!   and freed again between the pool read and that re-read, with the
//!   scan reading it between the write and the zeroing: it would be
//!   reported (never the reverse: a written free extent is never missed).

use std::fmt;

use cluster_store::evol::{EvolKeys, NamespaceRecord, Placement, PoolView};
use cluster_store::Store;
use nvmf_initiator::blocking::HostIdentity;
use nvmf_initiator::Command;

use crate::nvme::NsConnection;

/// Most bytes read per command (the controller's maximum transfer may
/// lower it).
pub const SCAN_CHUNK: u64 = 1 << 20;

/// What the data scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanFinding {
    /// A physical extent free in etcd (before and after it was read)
    /// that does not read all zeros.
    WrittenButUnmapped {
        /// The namespace.
        namespace: String,
        /// The physical extent.
        pext: u64,
        /// The offset of its first nonzero byte, within the extent.
        offset: u64,
    },
    /// A namespace that could not be connected to or read: its remaining
    /// free extents were not scanned.
    Unreachable {
        /// The namespace.
        namespace: String,
        /// Why.
        error: String,
    },
    /// A free extent that cannot be addressed on its namespace (beyond
    /// the capacity the target reports, or not a block multiple).
    Unreadable {
        /// The namespace.
        namespace: String,
        /// The physical extent.
        pext: u64,
        /// Why.
        error: String,
    },
}

impl fmt::Display for ScanFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanFinding::WrittenButUnmapped {
                namespace,
                pext,
                offset,
            } => write!(
                f,
                "namespace {namespace} physical extent {pext}: written but unmapped (free in etcd; first nonzero byte at offset {offset} of the extent)"
            ),
            ScanFinding::Unreachable { namespace, error } => {
                write!(f, "namespace {namespace} unreachable: {error}")
            }
            ScanFinding::Unreadable {
                namespace,
                pext,
                error,
            } => write!(
                f,
                "namespace {namespace} physical extent {pext}: not scanned: {error}"
            ),
        }
    }
}

/// One namespace's scan, for the progress line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceScan {
    /// The namespace.
    pub namespace: String,
    /// Its free extents (in the pool's view).
    pub free: u64,
    /// Free extents read whole or to their first nonzero byte.
    pub scanned: u64,
    /// Nonzero extents found mapped or zeroing when read again in etcd
    /// (not findings).
    pub raced: u64,
    /// Its findings.
    pub findings: Vec<ScanFinding>,
}

/// A host identity with NQN `nqn`: its host ID from an NQN of the uuid
/// form (`...:uuid:UUID`), else a random one.
pub fn host_identity(nqn: &str) -> HostIdentity {
    let id = nqn
        .rsplit_once(":uuid:")
        .and_then(|(_, u)| nvmf_proto::uuid::parse_uuid(u))
        .unwrap_or_else(|| HostIdentity::random().id);
    HostIdentity {
        nqn: nqn.to_owned(),
        id,
    }
}

/// The physical extents of `ns` free in `view`: no `pext` key.
pub fn free_extents(view: &PoolView, ns: &NamespaceRecord) -> Vec<u64> {
    (0..ns.extents)
        .filter(|p| {
            let at = (ns.id.clone(), *p);
            !view.pexts.contains_key(&at) && !view.zeroing.contains_key(&at)
        })
        .collect()
}

/// Scans the free extents of every namespace in `view` (read from
/// `store` under `keys`), connecting as `host` (None: the system's
/// identity); `progress` is called after each namespace. Every finding,
/// in namespace order.
pub fn scan_free_extents(
    store: &Store,
    keys: &EvolKeys,
    view: &PoolView,
    host: Option<&HostIdentity>,
    mut progress: impl FnMut(&NamespaceScan),
) -> Vec<ScanFinding> {
    let mut all = Vec::new();
    for ns in view.namespaces.values() {
        let s = scan_namespace(store, keys, view, ns, host);
        progress(&s);
        all.extend(s.findings);
    }
    all
}

fn scan_namespace(
    store: &Store,
    keys: &EvolKeys,
    view: &PoolView,
    ns: &NamespaceRecord,
    host: Option<&HostIdentity>,
) -> NamespaceScan {
    let free = free_extents(view, ns);
    let mut out = NamespaceScan {
        namespace: ns.id.clone(),
        free: free.len() as u64,
        scanned: 0,
        raced: 0,
        findings: Vec::new(),
    };
    if free.is_empty() {
        return out;
    }
    log::info!(
        "namespace {}: scanning {} free extents at {} ({} namespace {})",
        ns.id,
        free.len(),
        ns.address,
        ns.subnqn,
        ns.nsid
    );
    let unreachable = |error: String| ScanFinding::Unreachable {
        namespace: ns.id.clone(),
        error,
    };
    let mut conn = match NsConnection::connect(ns, host) {
        Ok(c) => c,
        Err(e) => {
            out.findings.push(unreachable(e));
            return out;
        }
    };
    let bs = conn.block_size();
    // Block multiples, at most the controller's transfer and the extent.
    let chunk_blocks = (SCAN_CHUNK.min(conn.max_transfer_bytes()) / bs.max(1)).max(1);
    let mut buf = Some(vec![0u8; (chunk_blocks * bs) as usize]);
    for pext in free {
        let (first, blocks) = match conn.extent_blocks(pext) {
            Ok(r) => r,
            Err(error) => {
                out.findings.push(ScanFinding::Unreadable {
                    namespace: ns.id.clone(),
                    pext,
                    error,
                });
                continue;
            }
        };
        let mut at = 0;
        let mut nonzero = None;
        while at < blocks && nonzero.is_none() {
            let n = (blocks - at).min(chunk_blocks);
            let mut b = buf.take().unwrap_or_default();
            // Within the capacity it already has: no allocation.
            b.resize((n * bs) as usize, 0);
            let cmd = Command::Read {
                nsid: ns.nsid,
                slba: first + at,
                block_size: bs as u32,
            };
            match conn.run(cmd, Some(b), "Read") {
                Ok(Some(b)) => {
                    if let Some(i) = first_nonzero(&b) {
                        nonzero = Some(at * bs + i as u64);
                    }
                    buf = Some(b);
                }
                Ok(None) => {
                    out.findings.push(unreachable(format!(
                        "reading physical extent {pext}: no data"
                    )));
                    return out;
                }
                Err(e) => {
                    out.findings
                        .push(unreachable(format!("reading physical extent {pext}: {e}")));
                    return out;
                }
            }
            at += n;
        }
        out.scanned += 1;
        let Some(offset) = nonzero else {
            continue;
        };
        // Mapped (and written) since the pool was read? Ask etcd again.
        let copy = Placement {
            namespace: ns.id.clone(),
            pext,
        };
        match store.pext_record(keys, &copy) {
            Ok(None) => out.findings.push(ScanFinding::WrittenButUnmapped {
                namespace: ns.id.clone(),
                pext,
                offset,
            }),
            Ok(Some(r)) => {
                out.raced += 1;
                log::info!(
                    "namespace {} physical extent {pext}: holds data, but {} eVol {} extent {} since the pool was read; not a finding",
                    ns.id,
                    if r.zeroing { "was freed from" } else { "is mapped by" },
                    r.evol,
                    r.index
                );
            }
            Err(e) => out.findings.push(ScanFinding::Unreadable {
                namespace: ns.id.clone(),
                pext,
                error: format!(
                    "holds data (first nonzero byte at offset {offset}); reading its pext key again: {e}"
                ),
            }),
        }
    }
    out
}

/// The index of the first nonzero byte of `b`.
fn first_nonzero(b: &[u8]) -> Option<usize> {
    // Words first (the common case is all zeros), then the byte.
    let words = b.chunks_exact(8);
    let n = words.len();
    let w = words
        .into_iter()
        .position(|w| w.iter().fold(0, |a, x| a | x) != 0)
        .unwrap_or(n);
    b[w * 8..].iter().position(|x| *x != 0).map(|i| w * 8 + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_nonzero_finds_the_first_byte() {
        assert_eq!(first_nonzero(&[0; 4096]), None);
        assert_eq!(first_nonzero(&[]), None);
        for at in [0, 1, 7, 8, 9, 4095] {
            let mut b = vec![0u8; 4096];
            b[at] = 1;
            b[4095] = 2;
            assert_eq!(first_nonzero(&b), Some(at), "{at}");
        }
        let mut b = vec![0u8; 13];
        b[12] = 3;
        assert_eq!(first_nonzero(&b), Some(12));
    }

    #[test]
    fn host_identity_takes_the_uuid_of_a_uuid_nqn() {
        let h =
            host_identity("nqn.2014-08.org.nvmexpress:uuid:01234567-89ab-4cde-8f01-23456789abcd");
        assert_eq!(h.id[0], 0x01);
        assert_eq!(h.id[15], 0xcd);
        let h = host_identity("nqn.2026-01.io.example:scanner");
        assert_eq!(h.nqn, "nqn.2026-01.io.example:scanner");
    }

    #[test]
    fn free_extents_skip_mapped_and_zeroing() {
        let ns = NamespaceRecord {
            schema: 1,
            id: "ns0".into(),
            target: "t".into(),
            address: "127.0.0.1:1".into(),
            subnqn: "nqn".into(),
            nsid: 1,
            extents: 5,
            extent_bytes: 2 << 20,
        };
        let mut view = PoolView::default();
        view.pexts.insert(("ns0".into(), 1), ("v".into(), 0));
        view.pexts.insert(("other".into(), 2), ("v".into(), 1));
        view.zeroing.insert(
            ("ns0".into(), 3),
            cluster_store::evol::PextRecord::freed_from("v", 2),
        );
        assert_eq!(free_extents(&view, &ns), vec![0, 2, 4]);
    }
}
