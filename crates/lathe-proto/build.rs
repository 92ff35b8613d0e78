//! Compiles the gRPC API, `proto/lathe/v1/lathe.proto` at the workspace root, with the vendored
//! protoc (none is installed on build hosts), and writes the file descriptor set that the
//! server's reflection service serves, and (with `pbjson-build`, from that descriptor set) the
//! serde implementations of the standard proto3 JSON mapping that the HTTP/JSON API and
//! `lathe query --json` speak. The write log's entries (`proto/lathe/log`) are the
//! server's own and are built by its `build.rs`.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    println!(
        "cargo:rerun-if-changed={}",
        proto_root.join("lathe/v1").display()
    );
    let descriptor_path = out_dir.join("lathe_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .compile_protos(&[proto_root.join("lathe/v1/lathe.proto")], &[proto_root])?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptor_path)?)?
        .build(&[".lathe.v1"])?;
    Ok(())
}
