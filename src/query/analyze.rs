//! The analyze stage: one analysis pass per retrieved section — budget-token offsets for cutting and counting,
//! analysed term positions for chunk BM25 — cached by content hash.

use std::sync::Arc;

use rayon::prelude::*;

use super::{term_hash, SectionAnalysis};
use crate::content_hash::content_hash;
use crate::cpu_pool;
use crate::index::{schema, SectionHit};
use crate::tokenizer::BudgetTokenizer;

/// The section cache's key: the tokenizer and the section text, so an entry can never describe
/// another version of a section, and survives writes to other documents.
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

/// The analysis of each section's text, in order, and how many were computed rather than found
/// in the cache. Sections are analysed side by side when the CPU pool has threads to spare.
#[tracing::instrument(level = "debug", skip_all, fields(tokenizer = tokenizer.name()))]
pub fn analyze(
    sections: &[SectionHit],
    tokenizer: &BudgetTokenizer,
    cache: &moka::sync::Cache<SectionKey, Arc<SectionAnalysis>>,
) -> (Vec<Arc<SectionAnalysis>>, u32) {
    let analysed: Vec<(Arc<SectionAnalysis>, bool)> = sections
        .par_iter()
        .with_min_len(cpu_pool::min_split_len())
        .map_init(schema::analyzer, |analyzer, section| {
            let text = section.text.as_str();
            let key = SectionKey::new(tokenizer.name(), text);
            let entry = cache
                .entry(key)
                .or_insert_with(|| Arc::new(analyze_one(text, tokenizer, analyzer)));
            let fresh = entry.is_fresh();
            (entry.into_value(), fresh)
        })
        .collect();
    let misses = analysed.iter().filter(|(_, fresh)| *fresh).count() as u32;
    (
        analysed.into_iter().map(|(analysis, _)| analysis).collect(),
        misses,
    )
}

fn analyze_one(
    text: &str,
    tokenizer: &BudgetTokenizer,
    analyzer: &mut tantivy::tokenizer::TextAnalyzer,
) -> SectionAnalysis {
    let tokens = tokenizer.offsets(text);
    let mut terms = Vec::with_capacity(tokens.len());
    let mut stream = analyzer.token_stream(text);
    while stream.advance() {
        let token = stream.token();
        terms.push((token.offset_from as u32, term_hash(&token.text)));
    }
    let mut sentences = Vec::new();
    crate::chunk::sentences(text, &mut sentences);
    SectionAnalysis {
        tokens,
        terms,
        sentences,
        spans_from_offsets: tokenizer.spans_count_from_offsets(text),
    }
}
