//! `gimbal-target plan` from the command line.

use std::process::Command;

#[test]
fn plan_prints_the_model_per_class() {
    let out = Command::new(env!("CARGO_BIN_EXE_gimbal-target"))
        .args([
            "plan",
            "--weights",
            "4,2,1",
            "--load",
            "high=max",
            "--load",
            "low=max",
            "--device",
            "100k",
            "--mode",
            "drr",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("DRR (bytes)"), "{text}");
    // Medium idle: high 4/5 and low 1/5 of the device.
    assert!(
        lines[3].starts_with("high") && lines[3].contains("80.00k"),
        "{text}"
    );
    assert!(lines[3].contains("80.0%"), "{text}");
    assert!(
        lines[5].starts_with("low") && lines[5].contains("20.00k"),
        "{text}"
    );
    assert!(lines[5].contains("20.0%"), "{text}");
}

#[test]
fn plan_rejects_an_unknown_class() {
    let out = Command::new(env!("CARGO_BIN_EXE_gimbal-target"))
        .args(["plan", "--load", "urgent=1", "--device", "1000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("class must be"));
}
