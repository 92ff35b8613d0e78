//! The analyze stage: one analysis pass per retrieved section — budget-token offsets for cutting and counting,
//! analysed term positions for chunk BM25 — cached by content hash.

use std::sync::Arc;

use super::{term_hash, SectionAnalysis};
use crate::content_hash::content_hash;
use crate::index::schema;
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

/// The analysis of each text, in order, and how many were computed rather than found in the cache.
#[tracing::instrument(level = "debug", skip_all, fields(tokenizer = tokenizer.name()))]
pub fn analyze(
    texts: impl Iterator<Item = impl AsRef<str>>,
    tokenizer: &BudgetTokenizer,
    cache: &moka::sync::Cache<SectionKey, Arc<SectionAnalysis>>,
) -> (Vec<Arc<SectionAnalysis>>, u32) {
    let mut analyzer = schema::analyzer();
    let mut misses = 0;
    let analyses = texts
        .map(|text| {
            let text = text.as_ref();
            let key = SectionKey::new(tokenizer.name(), text);
            let entry = cache
                .entry(key)
                .or_insert_with(|| Arc::new(analyze_one(text, tokenizer, &mut analyzer)));
            misses += u32::from(entry.is_fresh());
            entry.into_value()
        })
        .collect();
    (analyses, misses)
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
