//! The `limits`, `retrieval` and `cache` sections: what a request may ask for, how a query's
//! signals are weighed, and the caches' sizes.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    pub max_top_k: u32,
    pub max_token_budget: u32,
    /// Largest document text, in bytes.
    pub max_document_bytes: usize,
    /// Largest query text, in bytes.
    pub max_query_bytes: usize,
    /// Largest chunk size a request may ask for, in tokens.
    pub max_chunk_tokens: u32,
    /// Most documents in one upsert batch.
    pub max_batch_documents: usize,
    /// Most sections one document may produce.
    pub max_sections_per_document: usize,
    /// Deepest element nesting of an HTML document (parsing costs time quadratic in the depth).
    pub max_html_depth: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrievalConfig {
    /// The least sections retrieved when a request gives no top_k (the budget may ask for more).
    pub default_top_k: u32,
    /// Chunk size from budgets of 2,048 on when neither request nor collection gives one, in tokens.
    pub default_chunk_tokens: u32,
    /// Weight of the section's (normalised) score in a chunk's score.
    pub section_weight: f32,
    /// Weight of the chunk's own normalised BM25.
    pub bm25_weight: f32,
    /// Weight of the chunk's pooled dense similarity to the query (normalised over candidates).
    pub dense_weight: f32,
    /// Reciprocal rank fusion of the section legs: `weight / (rrf_k + rank)`.
    pub rrf_k: f32,
    pub rrf_lexical_weight: f32,
    pub rrf_dense_weight: f32,
    /// MMR trade-off applied to a request that leaves `diversity` unset when its query is
    /// ambiguous (see `ambiguous_gap`); 0: never.
    pub ambiguous_diversity: f32,
    /// A query is ambiguous when the best chunk of its fifth-best document scores within this
    /// share of the chunk score's range (the sum of the weights in use) of its best chunk.
    pub ambiguous_gap: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Result cache: whole answers keyed by request and index generation (bytes).
    pub result_bytes: u64,
    /// Section cache: token offsets and term positions keyed by content hash (bytes). It spares
    /// a query the analysis of sections that earlier queries analysed: 64 MiB holds those of
    /// about ten thousand 256-token sections; at a million sections, four times that saved
    /// 0.1–0.3 ms a query for about 180 MiB (docs/notebook/benchmarks-notebook.md, "Smaller caches").
    pub section_bytes: u64,
    /// Query-vector cache: query vectors keyed by model and normalised query text (bytes).
    pub query_vector_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 64 << 20,
            max_top_k: 100,
            max_token_budget: 32_768,
            max_document_bytes: 16 << 20,
            max_query_bytes: 16 << 10,
            max_chunk_tokens: 8_192,
            max_batch_documents: 10_000,
            max_sections_per_document: 50_000,
            max_html_depth: 4_096,
        }
    }
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        Self {
            default_top_k: 8,
            default_chunk_tokens: 128,
            section_weight: 0.5,
            bm25_weight: 1.0,
            dense_weight: 1.0,
            rrf_k: 60.0,
            rrf_lexical_weight: 1.0,
            rrf_dense_weight: 1.0,
            ambiguous_diversity: 0.3,
            ambiguous_gap: 0.2,
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            result_bytes: 64 << 20,
            section_bytes: 64 << 20,
            query_vector_bytes: 16 << 20,
        }
    }
}
