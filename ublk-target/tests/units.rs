//! The shipped systemd units pass `systemd-analyze verify` with no
//! diagnostics, and the udev rule calls a subcommand that exists.
//! `systemd-analyze` is installed by tests/vm/setup-host.sh; its absence is
//! a failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn systemd_units_verify_cleanly() {
    let dir = std::env::temp_dir().join(format!("ublk-nvmf-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = env!("CARGO_BIN_EXE_ublk-nvmf");
    // Point ExecStart at binaries that exist here (verify checks them).
    for unit in ["ublk-nvmf@.service", "gimbal-target.service"] {
        let text = std::fs::read_to_string(repo().join("systemd").join(unit)).unwrap();
        let text = text
            .replace("/usr/bin/ublk-nvmf", exe)
            .replace("/usr/bin/gimbal-target", exe);
        std::fs::write(dir.join(unit), text).unwrap();
    }
    let o = Command::new("systemd-analyze")
        .current_dir(&dir)
        .args([
            "verify",
            "--man=no",
            "./ublk-nvmf@vol0.service",
            "./gimbal-target.service",
        ])
        .output()
        .expect("systemd-analyze must be installed (tests/vm/setup-host.sh installs it)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.trim().is_empty(), "diagnostics: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn units_and_rules_use_real_subcommands() {
    let unit = std::fs::read_to_string(repo().join("systemd/ublk-nvmf@.service")).unwrap();
    assert!(unit.contains("Type=notify"));
    assert!(unit.contains("Restart=on-failure"));
    assert!(unit.contains("ublk-nvmf run --config /etc/ublk-nvmf/%i.toml"));
    let rules = std::fs::read_to_string(repo().join("udev/99-ublk-nvmf.rules")).unwrap();
    assert!(rules.contains("mq-deadline"));
    assert!(rules.contains("ublk-nvmf udev-name %k"));
    assert!(rules.contains("disk/by-id/ublk-nvmf-%c"));
    let o = Command::new(env!("CARGO_BIN_EXE_ublk-nvmf"))
        .args(["udev-name", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
}
