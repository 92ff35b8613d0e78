//! Compiles the gRPC API, `proto/lathe/v1/lathe.proto` at the workspace root, with the vendored
//! protoc (none is installed on build hosts), and writes the file descriptor set that the
//! server's reflection service serves. The write log's entries (`proto/lathe/log`) are the
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
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("lathe_descriptor.bin"))
        .compile_protos(&[proto_root.join("lathe/v1/lathe.proto")], &[proto_root])?;
    Ok(())
}
