//! `ublk-nvmf run/add/demo/del/status/udev-name` errors on a host without
//! ublk: each is one clear line. The device itself is exercised in the VM
//! bench (tests/vm/scenarios/ublk-*.sh).
//!
//! `UBLK_NVMF_CONTROL` points the ublk availability check at a path of the
//! test's choosing: a missing one simulates a kernel without `ublk_drv`;
//! `/dev/null` lets the command go on to the network so that target errors
//! show (it then fails at libublk's own control device, never reached
//! here).

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvmf_initiator::fake_target::{FakeConfig, FakeTarget};

const HOST: &str = "nqn.2026-01.io.test:server-cli-host";

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ublk-nvmf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cmd(control: &str, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ublk-nvmf"));
    c.args(args)
        .env("RUST_LOG", "off")
        .env("UBLK_NVMF_CONTROL", control)
        .env("UBLK_NVMF_RUN_DIR", dir.join("run"))
        .env("UBLK_NVMF_LIB_DIR", dir.join("lib"));
    c
}

fn run(control: &str, dir: &Path, args: &[&str]) -> Output {
    cmd(control, dir, args).output().expect("run ublk-nvmf")
}

fn one_line_error(o: &Output, what: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "should fail: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("ublk-nvmf: error: "), "{err}");
    for w in what {
        assert!(err.contains(w), "{err} should mention {w}");
    }
}

fn volume(dir: &Path, port: u16, subnqn: &str) -> PathBuf {
    let p = dir.join(format!("v{port}.toml"));
    let mut f = std::fs::File::create(&p).unwrap();
    write!(
        f,
        "name = \"v\"\n[target]\naddress = \"127.0.0.1\"\nport = {port}\nsubnqn = \"{subnqn}\"\n\
         [host]\nnqn = \"{HOST}\"\nid = \"00112233-4455-6677-8899-aabbccddeeff\"\n"
    )
    .unwrap();
    p
}

#[test]
fn missing_ublk_driver_names_modprobe_and_the_vm_bench() {
    let dir = tmpdir("noublk");
    let cfg = volume(&dir, 4420, "nqn.x");
    for args in [
        vec!["run", "--config", cfg.to_str().unwrap()],
        vec!["add", "--config", cfg.to_str().unwrap()],
        vec!["demo"],
        vec!["recover", "v"],
    ] {
        let o = run("/nonexistent/ublk-control", &dir, &args);
        one_line_error(&o, &["modprobe ublk_drv", "tests/vm/run"]);
    }
}

#[test]
fn not_root_is_said_plainly() {
    let dir = tmpdir("notroot");
    let cfg = volume(&dir, 4420, "nqn.x");
    let mut c = cmd(
        "/dev/null",
        &dir,
        &["run", "--config", cfg.to_str().unwrap()],
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        c.uid(65534).gid(65534);
    }
    let o = c.output().expect("run ublk-nvmf");
    one_line_error(&o, &["needs root"]);
}

#[test]
fn bad_config_names_file_line_and_field() {
    let dir = tmpdir("badcfg");
    let p = dir.join("bad.toml");
    std::fs::write(
        &p,
        "name = \"v\"\n[target]\naddress = \"127.0.0.1\"\nsubnqn = \"nqn.x\"\n[io]\nqueue_depth = 1\n",
    )
    .unwrap();
    let o = run("/dev/null", &dir, &["run", "--config", p.to_str().unwrap()]);
    one_line_error(
        &o,
        &[&format!("{}:6:", p.display()), "field `io.queue_depth`"],
    );
}

#[test]
fn target_errors_are_one_line() {
    let dir = tmpdir("target");
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = volume(&dir, dead, "nqn.x");
    let o = run(
        "/dev/null",
        &dir,
        &["run", "--config", cfg.to_str().unwrap()],
    );
    one_line_error(&o, &["volume v", "cannot connect to 127.0.0.1"]);

    let t = FakeTarget::new(FakeConfig {
        allowed_hosts: Some(vec!["nqn.2026-01.io.test:other".into()]),
        ..FakeConfig::default()
    });
    let s = t.serve();
    let port = s.addr().port();
    let cfg = volume(&dir, port, "nqn.2026-01.io.test:nope");
    let o = run(
        "/dev/null",
        &dir,
        &["run", "--config", cfg.to_str().unwrap()],
    );
    one_line_error(&o, &["no such subsystem NQN"]);
    let cfg = volume(&dir, port, &t.config().subnqn);
    let o = run(
        "/dev/null",
        &dir,
        &["add", "--config", cfg.to_str().unwrap()],
    );
    one_line_error(&o, &["host NQN not allowed"]);
}

#[test]
fn control_commands_on_a_stopped_volume() {
    let dir = tmpdir("ctl");
    one_line_error(&run("/dev/null", &dir, &["status", "v"]), &["not running"]);
    one_line_error(&run("/dev/null", &dir, &["del", "v"]), &["not running"]);
    let o = run("/dev/null", &dir, &["list"]);
    assert!(o.status.success());
    one_line_error(
        &run("/dev/null", &dir, &["udev-name", "ublkb0"]),
        &["not a ublk-nvmf device"],
    );
}

/// Under systemd journald stamps each line: ours carry no timestamp, and
/// a syslog priority prefix instead; elsewhere they keep theirs.
#[test]
fn log_lines_under_systemd_carry_no_timestamp() {
    let dir = tmpdir("journal");
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = volume(&dir, dead, "nqn.x");
    let run_logged = |systemd: bool| {
        let mut c = cmd(
            "/dev/null",
            &dir,
            &["run", "--config", cfg.to_str().unwrap()],
        );
        // The ioprio side channel's fallback warning is the one line
        // logged before the target is found dead.
        c.env("RUST_LOG", "warn")
            .env("UBLK_NVMF_IOPRIO_UNPRIVILEGED", "1")
            .env_remove("JOURNAL_STREAM")
            .env_remove("INVOCATION_ID");
        if systemd {
            c.env("INVOCATION_ID", "0123456789abcdef0123456789abcdef");
        }
        let o = c.output().expect("run ublk-nvmf");
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let journal = run_logged(true);
    let line = journal
        .lines()
        .find(|l| l.contains("ioprio side channel unavailable"))
        .unwrap_or_else(|| panic!("no warning in {journal}"));
    assert!(line.starts_with("<4>ublk_nvmf"), "{line}");
    let plain = run_logged(false);
    let line = plain
        .lines()
        .find(|l| l.contains("ioprio side channel unavailable"))
        .unwrap_or_else(|| panic!("no warning in {plain}"));
    assert!(
        line.starts_with("[20") && line.contains("Z WARN "),
        "{line}"
    );
}
