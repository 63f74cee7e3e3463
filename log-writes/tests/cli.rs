//! The `log-writes-replay` binary on a synthetic log in a file.

use std::path::Path;
use std::process::Command;

use log_writes::writer::LogWriter;

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_log-writes-replay"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn list_and_replay_step_by_step() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.img");
    let dev = dir.path().join("dev.img");
    let mut w = LogWriter::new(512);
    w.write(0, &[1u8; 1024]).flush().mark("durable-1");
    w.fua(4, &[2u8; 512]).mark("durable-2");
    std::fs::write(&log, w.finish(4096)).unwrap();
    std::fs::write(&dev, vec![0u8; 8 * 512]).unwrap();

    let (ok, out, err) = run(&["--log", s(&log), "--list"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "# entries 5 sector-size 512\n0 - 0 2\n1 FLUSH 0 0\n2 MARK 0 0 durable-1\n3 FUA 4 1\n4 MARK 0 0 durable-2\n"
    );

    let (ok, out, err) = run(&[
        "--log",
        s(&log),
        "--replay",
        s(&dev),
        "--until-mark",
        "durable-1",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("replayed entries 0..=2 of 5: 1 writes"),
        "{out}"
    );
    assert!(out.ends_with("next-entry 3\n"), "{out}");
    let d = std::fs::read(&dev).unwrap();
    assert!(d[..1024].iter().all(|&b| b == 1) && d[1024..].iter().all(|&b| b == 0));

    let (ok, out, err) = run(&[
        "--log",
        s(&log),
        "--replay",
        s(&dev),
        "--start-entry",
        "3",
        "--until-flush",
    ]);
    assert!(ok, "{err}");
    assert!(out.ends_with("next-entry 4\n"), "{out}");
    assert!(std::fs::read(&dev).unwrap()[2048..2560]
        .iter()
        .all(|&b| b == 2));

    let (ok, _, err) = run(&[
        "--log",
        s(&log),
        "--replay",
        s(&dev),
        "--until-mark",
        "durable-9",
    ]);
    assert!(!ok);
    assert!(err.contains("no mark 'durable-9'"), "{err}");
}

#[test]
fn a_target_smaller_than_the_writes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.img");
    let dev = dir.path().join("dev.img");
    let mut w = LogWriter::new(512);
    w.write(7, &[1u8; 1024]);
    std::fs::write(&log, w.finish(0)).unwrap();
    std::fs::write(&dev, vec![0u8; 8 * 512]).unwrap();
    let (ok, _, err) = run(&["--log", s(&log), "--replay", s(&dev)]);
    assert!(!ok);
    assert!(err.contains("end past the replay target"), "{err}");
    assert!(std::fs::read(&dev).unwrap().iter().all(|&b| b == 0));
}
