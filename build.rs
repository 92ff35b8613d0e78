//! Compiles `proto/lathe/log/v1/log.proto` (the replicated write log's entries) and
//! `proto/lathe/queue/v1/queue.proto` (the single node's write queue) with the vendored
//! protoc (none is installed on build hosts). The gRPC API (`proto/lathe/v1`) is built by the
//! `lathe-proto` crate, which the server and the tools share.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/lathe/log");
    println!("cargo:rerun-if-changed=proto/lathe/queue");
    // Messages only: the log is read and written over NATS, the queue on disk; neither is served.
    // Maps as BTreeMaps: their entries are encoded in key order, so one write always encodes to
    // the same bytes (the queue's write hash, which a repeated `write_id` must match, is of those
    // bytes; a HashMap's order differs from map to map).
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .btree_map(".")
        .compile_protos(
            &[
                "proto/lathe/log/v1/log.proto",
                "proto/lathe/queue/v1/queue.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
