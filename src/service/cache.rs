//! The service's caches, both bounded in bytes by a weigher and keyed so they can never serve
//! stale data:
//! - results: whole answers keyed by the collection, the index generation the answer was computed
//!   on, and the normalised request. A write moves the generation, so old entries are never hit.
//! - sections: the analyze stage's per-section analysis, keyed by [`SectionKey`] (the tokenizer
//!   and a hash of the section text). Content-addressed, so it survives writes to other documents
//!   and can never describe a different version of a section.
//! - query vectors: the embed stage's query vector, keyed by [`QueryVectorKey`] (the model and the
//!   normalised query text), which is all the vector depends on: writes never make one stale, and
//!   the same question at another budget skips the model.

use std::sync::Arc;

use moka::sync::Cache;

use crate::query::analyze::SectionKey;
use crate::query::embed::{QueryVectorCache, QueryVectorKey};
use crate::query::SectionAnalysis;
use crate::types::{RetrieveQuery, RetrieveResult};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResultKey {
    /// Unique per opening of a collection, so a deleted and recreated one starts afresh.
    pub incarnation: u64,
    pub generation: u64,
    pub query: RetrieveQuery,
}

#[derive(Clone)]
pub struct Caches {
    pub results: Cache<ResultKey, Arc<RetrieveResult>>,
    pub sections: Cache<SectionKey, Arc<SectionAnalysis>>,
    pub query_vectors: QueryVectorCache,
}

impl Caches {
    pub fn new(result_bytes: u64, section_bytes: u64, query_vector_bytes: u64) -> Self {
        let results = Cache::builder()
            .max_capacity(result_bytes)
            .weigher(|key: &ResultKey, value: &Arc<RetrieveResult>| {
                let bytes = key.query.query.len() + value.heap_bytes() + 256;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .build();
        let sections = Cache::builder()
            .max_capacity(section_bytes)
            .weigher(|_: &SectionKey, value: &Arc<SectionAnalysis>| {
                u32::try_from(value.heap_bytes() + 64).unwrap_or(u32::MAX)
            })
            .build();
        let query_vectors = Cache::builder()
            .max_capacity(query_vector_bytes)
            .weigher(|key: &QueryVectorKey, vector: &Arc<[f32]>| {
                let bytes = key.query.len() + std::mem::size_of_val(&**vector) + 64;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .build();
        Self {
            results,
            sections,
            query_vectors,
        }
    }
}
