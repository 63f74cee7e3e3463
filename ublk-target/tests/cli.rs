//! The `ublk-nvmf` command against the scripted fake target on loopback:
//! discover, identify, bench (with verification and JSON), and the one-line
//! errors for an unreachable target, an unknown NQN, a refused host and a
//! failing run.

use std::net::TcpListener;
use std::process::{Command, Output};

use nvmf_initiator::fake_target::{FakeConfig, FakeTarget, Fault, Trigger};

fn ublk_nvmf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ublk-nvmf"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("run ublk-nvmf")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const HOST: &str = "nqn.2026-01.io.test:cli-host";

#[test]
fn discover_and_identify() {
    let t = FakeTarget::new(FakeConfig::default());
    let s = t.serve();
    let port = s.addr().port().to_string();
    let o = ublk_nvmf(&[
        "discover",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
        "--hostnqn",
        HOST,
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains(&format!("subnqn:  {}", t.config().subnqn)),
        "{out}"
    );
    let o = ublk_nvmf(&[
        "identify",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
        "-n",
        &t.config().subnqn,
        "--hostnqn",
        HOST,
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("mn        : fake target"), "{out}");
    assert!(
        out.contains("namespace 1: 8192 blocks of 512 bytes"),
        "{out}"
    );
}

#[test]
fn bench_verifies_and_reports_json() {
    let t = FakeTarget::new(FakeConfig::default());
    let s = t.serve();
    let port = s.addr().port().to_string();
    for (rw, bs) in [("randrw", "4k"), ("write", "64k"), ("read", "16k")] {
        let o = ublk_nvmf(&[
            "bench",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-n",
            &t.config().subnqn,
            "--hostnqn",
            HOST,
            "--rw",
            rw,
            "--bs",
            bs,
            "--iodepth",
            "8",
            "--numjobs",
            "2",
            "--runtime",
            "0",
            "--size",
            "2m",
            "--verify",
            "--json",
            "--hdgst",
            "--ddgst",
        ]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{rw}: {err}");
        assert!(out.contains("\"errors\":0,\"verify_errors\":0"), "{out}");
        assert!(out.contains("\"p99.9\""), "{out}");
        assert!(!out.contains("\"verified_units\":0"), "{out}");
    }
    let o = ublk_nvmf(&[
        "bench",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
        "-n",
        &t.config().subnqn,
        "--hostnqn",
        HOST,
        "--rw",
        "randread",
        "--bs",
        "4k",
        "--runtime",
        "1",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("read: IOPS="), "{out}");
}

#[test]
fn bench_fails_on_io_errors() {
    // The target goes silent and refuses to come back in time: the run
    // must end with errors and a non-zero exit, not hang.
    let t = FakeTarget::new(FakeConfig {
        fault: Some((Fault::Silence, Trigger::NthIo(20))),
        ..FakeConfig::default()
    });
    let s = t.serve();
    let port = s.addr().port().to_string();
    s.refuse(false);
    let child = std::thread::spawn({
        let port = port.clone();
        let nqn = t.config().subnqn.clone();
        move || {
            ublk_nvmf(&[
                "bench",
                "-a",
                "127.0.0.1",
                "-s",
                &port,
                "-n",
                &nqn,
                "--hostnqn",
                HOST,
                "--rw",
                "randwrite",
                "--runtime",
                "0",
                "--size",
                "1m",
                "--io-timeout",
                "1",
                "--ctrl-loss-tmo",
                "0",
                "--reconnect-delay",
                "1",
            ])
        }
    });
    // Refuse reconnects once the fault has had time to fire.
    std::thread::sleep(std::time::Duration::from_millis(300));
    s.refuse(true);
    let o = child.join().unwrap();
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("I/O error"), "{err}");
}

fn one_line_error(o: &Output, what: &str) {
    let (_, err) = text(o);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("ublk-nvmf: error: "), "{err}");
    assert!(err.contains(what), "{err} should mention {what}");
}

#[test]
fn clear_errors() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dead = addr.port().to_string();
    one_line_error(
        &ublk_nvmf(&["identify", "-a", "127.0.0.1", "-s", &dead, "-n", "nqn.x"]),
        "cannot connect to 127.0.0.1",
    );
    one_line_error(
        &ublk_nvmf(&["discover", "-a", "127.0.0.1", "-s", &dead]),
        "cannot connect",
    );
    let t = FakeTarget::new(FakeConfig {
        allowed_hosts: Some(vec!["nqn.2026-01.io.test:other".into()]),
        ..FakeConfig::default()
    });
    let s = t.serve();
    let port = s.addr().port().to_string();
    one_line_error(
        &ublk_nvmf(&[
            "identify",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-n",
            "nqn.2026-01.io.test:nope",
            "--hostnqn",
            HOST,
        ]),
        "no such subsystem NQN",
    );
    one_line_error(
        &ublk_nvmf(&[
            "bench",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-n",
            &t.config().subnqn,
            "--hostnqn",
            HOST,
        ]),
        "host NQN not allowed",
    );
    one_line_error(
        &ublk_nvmf(&[
            "bench",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-n",
            "x",
            "--rw",
            "sideways",
        ]),
        "--rw 'sideways'",
    );
}

// Keys from nvme-cli 2.3's `nvme gen-dhchap-key` (nvmf-proto's
// tests/proto/auth_secret.rs).
const HOST_KEY: &str = "DHHC-1:01:0GUMxintlD+1ntU08h7zQX+9eM5PTH0Hf6y+psRsmsIZCqCa:";
const CTRL_KEY: &str = "DHHC-1:01:5NmdC6ei6ufThKzxcNLrVwG7B51dcFJp4loC4hNpFH00R4sa:";

/// The options that reach a fake target on `port` with subsystem `nqn`, as
/// host `HOST`.
fn target_args<'a>(port: &'a str, nqn: &'a str) -> [&'a str; 8] {
    ["-a", "127.0.0.1", "-s", port, "-n", nqn, "--hostnqn", HOST]
}

/// Linux's nvmet authenticates only the admin queue since 6.15: with both
/// keys, the I/O queues connect without a transaction and carry I/O.
#[test]
fn dhchap_with_a_target_that_authenticates_only_the_admin_queue() {
    use nvmf_proto::auth::DhchapSecret;
    let t = FakeTarget::new(FakeConfig {
        dhchap: Some((
            DhchapSecret::parse(HOST_KEY).unwrap(),
            Some(DhchapSecret::parse(CTRL_KEY).unwrap()),
        )),
        dhchap_admin_only: true,
        ..FakeConfig::default()
    });
    let s = t.serve();
    let port = s.addr().port().to_string();
    let nqn = t.config().subnqn.clone();
    let mut args = vec!["bench"];
    args.extend_from_slice(&target_args(&port, &nqn));
    args.extend_from_slice(&[
        "--dhchap-secret",
        HOST_KEY,
        "--dhchap-ctrl-secret",
        CTRL_KEY,
        "--runtime",
        "1",
        "--rw",
        "randrw",
        "--verify",
    ]);
    let o = ublk_nvmf(&args);
    assert!(o.status.success(), "{}", text(&o).1);
}

#[test]
fn dhchap_options_with_nvme_cli_names() {
    use nvmf_proto::auth::DhchapSecret;
    let t = FakeTarget::new(FakeConfig {
        dhchap: Some((
            DhchapSecret::parse(HOST_KEY).unwrap(),
            Some(DhchapSecret::parse(CTRL_KEY).unwrap()),
        )),
        ..FakeConfig::default()
    });
    let s = t.serve();
    let port = s.addr().port().to_string();
    let nqn = t.config().subnqn.clone();
    let base = target_args(&port, &nqn);
    let run = |cmd: &str, extra: &[&str]| {
        let mut args = vec![cmd];
        args.extend_from_slice(&base);
        args.extend_from_slice(extra);
        ublk_nvmf(&args)
    };
    // Both keys: the host proves its key, the target proves its own.
    let o = run(
        "identify",
        &[
            "--dhchap-secret",
            HOST_KEY,
            "--dhchap-ctrl-secret",
            CTRL_KEY,
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("nn "), "{out}");
    let o = run(
        "bench",
        &[
            "-S",
            HOST_KEY,
            "--runtime",
            "1",
            "--rw",
            "randrw",
            "--verify",
        ],
    );
    assert!(o.status.success(), "{}", text(&o).1);
    // No key, a wrong key, a bad key: one line each, never the key.
    one_line_error(
        &run("identify", &[]),
        "requires DH-HMAC-CHAP authentication",
    );
    let o = run("identify", &["--dhchap-secret", CTRL_KEY]);
    one_line_error(&o, "DH-HMAC-CHAP authentication failed on queue 0");
    assert!(!text(&o).1.contains("5NmdC6ei"), "{}", text(&o).1);
    let o = run("identify", &["--dhchap-secret", "DHHC-1:01:AAAA:"]);
    one_line_error(&o, "--dhchap-secret: DH-HMAC-CHAP secret");
    one_line_error(
        &run("identify", &["--dhchap-ctrl-secret", CTRL_KEY]),
        "--dhchap-ctrl-secret needs --dhchap-secret",
    );
}
