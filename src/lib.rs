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
//! - [`replication`]: with `replication.nats_url` set, the write log on NATS JetStream that every
//!   replica applies.
//! - [`sections`]: ingest-time splitting of documents into sections by structure.
//! - [`chunk`]: query-time chunking strategies over token offsets.
//! - Leaves usable by any layer: [`tokens`], [`tokenizer`], [`content_hash`], [`cpu_pool`],
//!   [`config`], [`error`], [`types`].

pub mod api;
pub mod chunk;
pub mod cli;
pub mod client;
pub mod config;
pub mod content_hash;
pub mod cpu_pool;
pub mod dense;
pub mod embed;
pub mod error;
pub mod eval;
pub mod index;
pub mod ingest;
pub mod query;
pub mod replication;
pub mod sections;
pub mod service;
pub mod telemetry;
pub mod tokenizer;
pub mod tokens;
pub mod types;
