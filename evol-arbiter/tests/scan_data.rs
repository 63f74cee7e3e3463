//! `evol-arbiter check --scan-data` reads every free physical extent over
//! NVMe/TCP: a real etcd (cluster_store::testing), an in-process
//! gimbal-target with a file namespace, an arbiter and the `check`
//! command as the real binary. The test writes the physical extents
//! directly over NVMe/TCP, as a client would (and as a client writing
//! through a stale map would). The race with a mapping made after the
//! pool was read is the library's `scan_free_extents` given an old view.
//!
//! No timing assertions: every wait is on a condition with a generous
//! deadline.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cluster_store::evol::{check, EvolKeys};
use cluster_store::testing::EtcdCluster;
use evol_arbiter::scan::scan_free_extents;
use gimbal_target::server::TargetHandle;
use nvmf_initiator::blocking::Controller;

mod common;
use common::{client, free_port, Arb, BIN, LONG};

const NQN: &str = "nqn.2026-01.io.test:scan";
const EXTENT: u64 = 2 << 20;
/// Extents of the namespace.
const NS_EXTENTS: u64 = 8;
/// Extents the eVol maps and writes.
const MAPPED: u64 = 3;
const PREFIX: &str = "/scan";

fn target(port: u16, image: &Path) -> TargetHandle {
    common::file_target(port, NQN, image, NS_EXTENTS * EXTENT)
}

fn host(port: u16) -> Controller {
    common::host(port, NQN)
}

/// `evol-arbiter check` with `extra` arguments: its exit code and stdout.
fn run_check(etcd: &EtcdCluster, extra: &[&str]) -> (i32, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN)
        .args(["check", "--endpoints", &etcd.endpoints().join(",")])
        .args(["--prefix", PREFIX])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running evol-arbiter check");
    let out = String::from_utf8_lossy(&stdout).into_owned();
    eprintln!(
        "check {extra:?}: {status}\n{out}{}",
        String::from_utf8_lossy(&stderr)
    );
    (status.code().unwrap_or(-1), out)
}

#[test]
fn scan_data_finds_a_written_free_extent_and_an_unreachable_namespace() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("ns.img");
    let port = free_port();
    let t = target(port, &image);
    let store = etcd.store(Duration::from_secs(5)).unwrap();
    let _a = Arb::start(dir.path(), "a", &etcd, PREFIX);
    let c = client(&etcd, PREFIX);
    common::add_ns0(&c, port, NQN, NS_EXTENTS);
    c.create_volume("v", NS_EXTENTS * EXTENT, 1, 1).unwrap();
    // The pool before any mapping: every extent free.
    let keys = EvolKeys::new(PREFIX);
    let before = store.read_pool(&keys).unwrap();
    let mapped: Vec<u64> = (0..MAPPED)
        .map(|i| {
            let r = c.allocate("v", i, Instant::now() + LONG).unwrap();
            assert_eq!(r.copies.len(), 1);
            r.copies[0].pext
        })
        .collect();
    // The client's data, in every byte of the mapped extents.
    let h = host(port);
    for (i, p) in mapped.iter().enumerate() {
        h.write(1, p * EXTENT / 512, &vec![0xa0 + i as u8; EXTENT as usize])
            .unwrap();
    }
    let free = NS_EXTENTS - MAPPED;
    let view = store.read_pool(&keys).unwrap();
    assert!(check(&view).is_empty());
    assert_eq!(view.pexts.len(), MAPPED as usize);

    // The race: a scan of the pool as read before the mappings finds
    // the mapped extents' data, reads their pext keys again and reports
    // none of them.
    let mut lines = Vec::new();
    let found = scan_free_extents(&store, &keys, &before, None, |s| lines.push(s.clone()));
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (lines[0].free, lines[0].scanned, lines[0].raced),
        (NS_EXTENTS, NS_EXTENTS, MAPPED),
        "{lines:?}"
    );

    // Mapped extents hold data, free ones read zeros: clean.
    let (code, out) = run_check(&etcd, &["--scan-data"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "namespace ns0: {free} of {free} free extents scanned, 0 finding(s)"
        )),
        "{out}"
    );
    assert!(out.contains("no findings"), "{out}");

    // A write through a stale map: 4 KiB into the middle of a free extent.
    let stray = (0..NS_EXTENTS).find(|p| !mapped.contains(p)).unwrap();
    let offset = EXTENT / 2 + 4096;
    h.write(1, (stray * EXTENT + offset) / 512, &[0x5a; 4096])
        .unwrap();
    h.flush(1).unwrap();
    let (code, out) = run_check(&etcd, &["--scan-data"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "FINDING: namespace ns0 physical extent {stray}: written but unmapped (free in etcd; first nonzero byte at offset {offset} of the extent)"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "namespace ns0: {free} of {free} free extents scanned, 1 finding(s)"
        )),
        "{out}"
    );
    assert!(out.contains("1 finding(s)"), "{out}");
    // An explicit host NQN connects too (the target allows any host).
    let (code, out) = run_check(
        &etcd,
        &["--scan-data", "--hostnqn", "nqn.2026-01.io.test:scanner"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("written but unmapped"), "{out}");
    // Without the flag, check reads etcd alone: clean.
    let (code, out) = run_check(&etcd, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("namespace ns0:"), "{out}");
    assert!(out.contains("no findings"), "{out}");

    // The target stops: the scan cannot look, and does not pass.
    drop(h);
    t.shutdown();
    let (code, out) = run_check(&etcd, &["--scan-data"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FINDING: namespace ns0 unreachable: "),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "namespace ns0: 0 of {free} free extents scanned, 1 finding(s)"
        )),
        "{out}"
    );
    let (code, out) = run_check(&etcd, &[]);
    assert_eq!(code, 0, "{out}");
}
