//! Lathe: a gRPC retrieval server for RAG that indexes whole sections and chunks at query time.
//!
//! A query retrieves the top-k sections (BM25 over tantivy), re-chunks only those on the fly,
//! scores the fine chunks, and packs the best into the caller's token budget with exact byte and
//! code-point offsets. Because chunks are cut at query time, a write never leaves stale chunks
//! behind and each caller gets chunks sized for its own model and budget.
//!
//! # Layout
//! - [`api`]: the gRPC edge (proto types, conversions, status mapping, handlers, server).
//! - [`service`]: `Engine`, what Lathe does: runs the two pipelines' stages in order; caches and
//!   metrics.
//! - [`ingest`]: the write stages: validate → section → sentences → embed → records.
//! - [`query`]: the read stages: validate → embed → coarse → analyze → rechunk → score → pack →
//!   assemble.
//! - [`index`]: collections on disk; tantivy indexes of sections; the writer and snapshots.
//! - `replication`: with `replication.nats_url` set, the write log on NATS JetStream that every
//!   replica applies.
//! - [`sections`], [`chunk`], [`tokens`], [`tokenizer`]: the text crate (`lathe-text`),
//!   re-exported under the paths the server's modules use: sections by structure at ingest,
//!   chunking at query time, token offsets and the budget tokenizers.
//! - Leaves usable by any layer: `content_hash`, `cpu_pool`, [`config`], [`error`], [`types`],
//!   `telemetry` (the crate's own: only what a test, a bench or the binary names is `pub`).
//! - [`launch`]: what `lathe serve` runs; [`dense_recall`]: the hidden `lathe dense-recall`;
//!   [`export`]: `lathe export`, a snapshot file's documents as JSONL.
//!
//! The client side (`lathe ingest`/`query`/`eval`, the benchmark programs) is the `lathe-tools`
//! crate, which reaches this one only over gRPC.

pub mod api;
pub mod config;
mod content_hash;
mod cpu_pool;
pub mod dense;
pub mod dense_recall;
pub mod embed;
pub mod error;
pub mod export;
pub mod index;
pub mod ingest;
pub mod launch;
mod mapped_fault;
mod panic_log;
pub mod query;
mod replication;
pub mod service;
mod telemetry;
#[cfg(test)]
mod test_log;
pub mod types;
mod write_queue;

pub use lathe_text::{chunk, sections, tokenizer, tokens};

/// The models folder `scripts/fetch-models.sh` lays out, for unit tests that load real models.
#[cfg(test)]
pub(crate) fn test_models_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models")
}
