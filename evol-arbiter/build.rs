//! Compiles proto/evol_arbiter.proto (needs `protoc`, Debian's
//! protobuf-compiler, as etcd-client's build does).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/evol_arbiter.proto");
    tonic_prost_build::configure().compile_protos(&["proto/evol_arbiter.proto"], &["proto"])?;
    Ok(())
}
