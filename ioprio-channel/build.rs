//! Compiles the BPF program with clang (`clang -target bpf -O2 -g`). Without
//! clang the crate still builds; the channel then reports at run time that
//! the program was not built, and the server uses its fallback class.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/ioprio.bpf.c";
    println!("cargo::rerun-if-changed={src}");
    println!("cargo::rerun-if-env-changed=CLANG");
    println!("cargo::rerun-if-env-changed=IOPRIO_CHANNEL_NO_BPF");
    println!("cargo::rustc-check-cfg=cfg(ioprio_bpf_object)");

    if env::var_os("IOPRIO_CHANNEL_NO_BPF").is_some() {
        println!("cargo::warning=IOPRIO_CHANNEL_NO_BPF set: building without the BPF program");
        return;
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("ioprio.bpf.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    // -g emits the BTF that CO-RE relocations and the map definitions need.
    let status = Command::new(&clang)
        .args([
            "-target", "bpf", "-O2", "-g", "-Wall", "-Werror", "-c", src, "-o",
        ])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => println!("cargo::rustc-cfg=ioprio_bpf_object"),
        Ok(s) => println!(
            "cargo::warning={clang} failed ({s}): the ioprio side channel will be unavailable"
        ),
        Err(e) => println!(
            "cargo::warning=cannot run {clang} ({e}): the ioprio side channel will be unavailable"
        ),
    }
}
