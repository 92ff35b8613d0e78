//! The `lathe` binary's client subcommands. Each is a gRPC client, so it exercises exactly what an
//! application sees; `main.rs` of the server crate wires them beside `serve`.

mod collections;
mod eval;
mod ingest;
pub mod ops;
mod query;
mod snapshot;

pub use collections::{alias, collections, AliasArgs, CollectionsArgs};
pub use eval::{eval, EvalArgs};
pub use ingest::{documents_from_jsonl, ingest, IngestArgs};
pub use ops::{ops, OpsArgs};
pub use query::{query, QueryArgs};
pub use snapshot::{restore, snapshot, RestoreArgs, SnapshotArgs};
