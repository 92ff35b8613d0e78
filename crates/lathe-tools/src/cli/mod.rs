//! The `lathe` binary's client subcommands. Each is a gRPC client, so it exercises exactly what an
//! application sees; `main.rs` of the server crate wires them beside `serve`. Every one takes
//! `--addr` and the connection options of [`crate::client::ConnectArgs`] (API key, TLS, mutual
//! TLS); a status the server answers reaches `main` inside the error, which prints it as gRPC
//! names it ([`crate::client::status_line`]).

mod collections;
mod eval;
mod health;
mod ingest;
pub mod ops;
mod query;
mod replicas;
mod snapshot;
mod units;

pub use collections::{alias, collections, AliasArgs, CollectionsArgs};
pub use eval::{eval, EvalArgs};
pub use health::{health, HealthArgs};
pub use ingest::{documents_from_jsonl, ingest, IngestArgs};
pub use ops::{ops, OpsArgs};
pub use query::{query, QueryArgs};
pub use replicas::{replicas, ReplicasArgs};
pub use snapshot::{restore, snapshot, RestoreArgs, SnapshotArgs};
