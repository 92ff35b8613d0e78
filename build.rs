//! Compiles `proto/lathe/v1/*.proto` (the gRPC API) and `proto/lathe/log/v1/log.proto` (the
//! replicated write log's entries) with the vendored protoc (none is installed on build hosts),
//! and writes the API's file descriptor set that the reflection service serves.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("lathe_descriptor.bin"))
        .compile_protos(&["proto/lathe/v1/lathe.proto"], &["proto"])?;
    // Messages only: the log is read and written over NATS, not served.
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&["proto/lathe/log/v1/log.proto"], &["proto"])?;
    Ok(())
}
