//! Lathe's tools: the client side of the `lathe` binary (`ingest`, `query`, `eval`) and the
//! benchmark programs (`lathe-bench`, `lathe-load`, `lathe-replicas`). They reach the server only
//! through its gRPC API (crate `lathe-proto`) or by running the `lathe` binary; Cargo keeps it so,
//! since this crate does not depend on the server.
//!
//! - [`client`]: connecting (API key, TLS, mutual TLS), strategy names, uploads in batches.
//! - [`server_process`]: a `lathe serve` child process on a loopback port, for a tool run
//!   without `--addr` and for the benchmark programs' servers.
//! - [`proc_status`]: a process's resident memory and CPU time, from `/proc`.
//! - [`scale_corpus`]: the scale benchmarks' corpus (copies of a source corpus) and queries.
//! - [`cli`]: the client subcommands' arguments and their runs.
//! - [`eval`]: datasets, answer scoring, the report and its plots.

pub mod cli;
pub mod client;
pub mod eval;
pub mod proc_status;
pub mod scale_corpus;
pub mod server_process;

/// The generated `lathe.v1` API the tools speak.
pub use lathe_proto as proto;
