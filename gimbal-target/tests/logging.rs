//! Under systemd journald stamps each line itself: `gimbal-target`'s log
//! lines then carry no timestamp of their own but a syslog priority
//! prefix (`<6>`), and keep their timestamp elsewhere.

use std::io::Write;
use std::net::TcpListener;
use std::process::Command;

#[test]
fn log_lines_under_systemd_carry_no_timestamp() {
    // A port in use makes `run` fail right after its first log lines.
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = tempfile::NamedTempFile::new().unwrap();
    write!(
        cfg,
        "listen = [\"{}\"]\n[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"1MiB\"\nqos = \"gimbal\"\n",
        busy.local_addr().unwrap()
    )
    .unwrap();
    let run = |systemd: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gimbal-target"));
        c.args(["run", "--config"])
            .arg(cfg.path())
            .env("RUST_LOG", "info")
            .env_remove("JOURNAL_STREAM")
            .env_remove("INVOCATION_ID");
        if systemd {
            c.env("INVOCATION_ID", "0123456789abcdef0123456789abcdef");
        }
        let o = c.output().unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let journal = run(true);
    let line = journal
        .lines()
        .find(|l| l.contains("switch clock"))
        .unwrap_or_else(|| panic!("no clock line in {journal}"));
    assert!(line.starts_with("<6>gimbal_target"), "{line}");
    let plain = run(false);
    let line = plain
        .lines()
        .find(|l| l.contains("switch clock"))
        .unwrap_or_else(|| panic!("no clock line in {plain}"));
    assert!(
        line.starts_with("[20") && line.contains("Z INFO "),
        "{line}"
    );
}
