//! Caches, both bounded in bytes by a weigher and keyed so they can never serve stale data:
//! - results: whole answers keyed by the collection, the index generation the answer was computed
//!   on, and the normalised request. A write moves the generation, so old entries are never hit.
//! - sections: per-section analysis (budget-token offsets, analysed term positions) keyed by the
//!   tokenizer and a hash of the section text. Content-addressed, so it survives writes to other
//!   documents and can never describe a different version of a section.

use std::sync::Arc;

use moka::sync::Cache;

use crate::content_hash::content_hash;
use crate::tokens::TokenOffsets;
use crate::types::{RetrieveQuery, RetrieveResult};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResultKey {
    /// Unique per opening of a collection, so a deleted and recreated one starts afresh.
    pub incarnation: u64,
    pub generation: u64,
    pub query: RetrieveQuery,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SectionKey {
    pub tokenizer: u64,
    pub content: [u8; 32],
}

impl SectionKey {
    pub fn new(tokenizer_name: &str, text: &str) -> Self {
        Self {
            tokenizer: content_hash([tokenizer_name.as_bytes()]),
            content: *blake3::hash(text.as_bytes()).as_bytes(),
        }
    }
}

/// What a section's single analysis pass produces.
#[derive(Debug, Default)]
pub struct SectionAnalysis {
    /// Budget-tokenizer offsets: chunk boundaries are cut on these.
    pub tokens: TokenOffsets,
    /// BM25 analyser tokens: (byte offset, hash of the analysed term), in order.
    pub terms: Vec<(u32, u64)>,
    /// Sentences of the text ([`crate::chunk::sentences`]), so chunking does not segment again.
    pub sentences: Vec<std::ops::Range<u32>>,
}

impl SectionAnalysis {
    fn heap_bytes(&self) -> usize {
        self.tokens.heap_bytes()
            + self.terms.capacity() * std::mem::size_of::<(u32, u64)>()
            + self.sentences.capacity() * std::mem::size_of::<std::ops::Range<u32>>()
    }
}

#[derive(Clone)]
pub struct Caches {
    pub results: Cache<ResultKey, Arc<RetrieveResult>>,
    pub sections: Cache<SectionKey, Arc<SectionAnalysis>>,
}

impl Caches {
    pub fn new(result_bytes: u64, section_bytes: u64) -> Self {
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
        Self { results, sections }
    }
}
