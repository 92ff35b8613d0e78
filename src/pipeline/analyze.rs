//! Stage 2: one analysis pass per retrieved section — budget-token offsets for cutting and counting,
//! analysed term positions for chunk BM25 — cached by content hash.

use std::hash::BuildHasher;
use std::sync::Arc;

use crate::cache::{SectionAnalysis, SectionKey};
use crate::index::schema;
use crate::tokenizer::BudgetTokenizer;

/// Hash of an analysed term, shared by section analysis and query terms.
pub fn term_hash(term: &str) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(term)
}

pub fn analyze(
    texts: impl Iterator<Item = impl AsRef<str>>,
    tokenizer: &BudgetTokenizer,
    cache: &moka::sync::Cache<SectionKey, Arc<SectionAnalysis>>,
) -> Vec<Arc<SectionAnalysis>> {
    let mut analyzer = schema::analyzer();
    texts
        .map(|text| {
            let text = text.as_ref();
            let key = SectionKey::new(tokenizer.name(), text);
            cache.get_with(key, || {
                Arc::new(analyze_one(text, tokenizer, &mut analyzer))
            })
        })
        .collect()
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
    SectionAnalysis { tokens, terms }
}
