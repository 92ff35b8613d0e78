//! Lathe's text layer, pure and synchronous: what a document's text is made of and how it is cut.
//! No async runtime, no index, no RPC: the server, the tools and the fuzz targets build on it.
//!
//! - [`tokens`]: token, sentence and byte/code-point offsets.
//! - [`tokenizer`]: the budget tokenizers (Hugging Face `tokenizer.json`, tiktoken) and their
//!   cached word counts.
//! - [`sections`]: ingest-time splitting of documents into sections by structure (Markdown, HTML,
//!   plain text).
//! - [`chunk`]: the query-time chunking strategies over token offsets, and their types.
//! - [`error`]: this crate's one error, a tokenizer that cannot be named or loaded.

pub mod chunk;
pub mod error;
pub mod sections;
pub mod tokenizer;
pub mod tokens;

/// A query's text with whitespace trimmed and collapsed, so that equivalent queries share a
/// cache entry (and a load generator can tell which questions the server sees as one).
pub fn normalise_query(query: &str) -> String {
    query.split_whitespace().collect::<Vec<_>>().join(" ")
}
