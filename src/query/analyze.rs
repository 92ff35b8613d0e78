//! The analyze stage: one analysis pass per retrieved section — budget-token offsets for cutting and counting,
//! analysed term positions for chunk BM25, the sentences stored with the section — cached by
//! content hash.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use super::{term_hash, SectionAnalysis};
use crate::content_hash::content_hash;
use crate::cpu_pool;
use crate::index::{schema, SectionHit};
use crate::tokenizer::BudgetTokenizer;

/// The section cache's key: the tokenizer, the section text and the sentences stored with it, so
/// an entry can never describe another version of a section, and survives writes to other
/// documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SectionKey {
    pub tokenizer: u64,
    pub content: [u8; 32],
}

impl SectionKey {
    /// The key of `section` analysed by the tokenizer whose name hashes to `tokenizer`
    /// ([`tokenizer_key`]). Its text is hashed with its length in front, then the stored sentence
    /// ranges (none for a section stored without them), so no two sections share a key unless
    /// both agree.
    pub fn of(tokenizer: u64, section: &SectionHit) -> Self {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&(section.text.len() as u64).to_le_bytes());
        hasher.update(section.text.as_bytes());
        for range in &section.sentences {
            hasher.update(&range.start.to_le_bytes());
            hasher.update(&range.end.to_le_bytes());
        }
        Self {
            tokenizer,
            content: *hasher.finalize().as_bytes(),
        }
    }
}

/// The tokenizer's part of a [`SectionKey`].
pub fn tokenizer_key(tokenizer: &BudgetTokenizer) -> u64 {
    content_hash([tokenizer.name().as_bytes()])
}

/// The analysis of each section's text, in order, and how many were computed rather than found
/// in the cache. Sections are analysed side by side when the CPU pool has threads to spare.
#[tracing::instrument(level = "debug", skip_all, fields(tokenizer = tokenizer.name()))]
pub fn analyze(
    sections: &[SectionHit],
    tokenizer: &BudgetTokenizer,
    cache: &moka::sync::Cache<SectionKey, Arc<SectionAnalysis>>,
) -> (Vec<Arc<SectionAnalysis>>, u32) {
    let tokenizer_key = tokenizer_key(tokenizer);
    let analysed: Vec<(Arc<SectionAnalysis>, bool)> = sections
        .par_iter()
        .with_min_len(cpu_pool::min_split_len())
        .map_init(schema::analyzer, |analyzer, section| {
            let key = SectionKey::of(tokenizer_key, section);
            let entry = cache
                .entry(key)
                .or_insert_with(|| Arc::new(analyze_one(section, tokenizer, analyzer)));
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

/// The sentences of `section`: those stored with it at ingest (the sentences stage ran
/// [`crate::chunk::sentences`] on the same text, and the stored section is verified on read), or,
/// for a section stored without them or with ranges that are not in order on char boundaries of
/// its text, the text segmented again.
fn sentences_of(section: &SectionHit) -> Vec<Range<u32>> {
    let text = section.text.as_str();
    let mut end = 0;
    let stored_hold = !section.sentences.is_empty()
        && section.sentences.iter().all(|range| {
            let ordered = end <= range.start && range.start <= range.end;
            end = range.end;
            ordered
                && (range.end as usize) <= text.len()
                && text.is_char_boundary(range.start as usize)
                && text.is_char_boundary(range.end as usize)
        });
    if stored_hold {
        return section.sentences.clone();
    }
    let mut sentences = Vec::new();
    crate::chunk::sentences(text, &mut sentences);
    sentences
}

fn analyze_one(
    section: &SectionHit,
    tokenizer: &BudgetTokenizer,
    analyzer: &mut tantivy::tokenizer::TextAnalyzer,
) -> SectionAnalysis {
    let text = section.text.as_str();
    let tokens = tokenizer.offsets(text);
    let mut terms = Vec::with_capacity(tokens.len());
    let mut stream = analyzer.token_stream(text);
    while stream.advance() {
        let token = stream.token();
        terms.push((token.offset_from as u32, term_hash(&token.text)));
    }
    SectionAnalysis {
        sentences: sentences_of(section),
        tokens,
        terms,
        spans_from_offsets: tokenizer.spans_count_from_offsets(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::{test_minilm, test_section_hit};

    fn cache() -> moka::sync::Cache<SectionKey, Arc<SectionAnalysis>> {
        moka::sync::Cache::new(64)
    }

    /// Stored sentences of one range.
    fn one(range: Range<u32>) -> Vec<Range<u32>> {
        vec![range]
    }

    fn computed(text: &str) -> Vec<Range<u32>> {
        let mut sentences = Vec::new();
        crate::chunk::sentences(text, &mut sentences);
        sentences
    }

    #[test]
    fn a_section_is_analysed_with_the_sentences_stored_with_it() {
        let text = "One sentence here. Another one follows. And a third, with é.";
        let stored = computed(text);
        assert_eq!(stored.len(), 3);
        let mut section = test_section_hit(1.0, text);
        section.sentences = stored.clone();
        let (analyses, misses) = analyze(std::slice::from_ref(&section), test_minilm(), &cache());
        assert_eq!(misses, 1);
        assert_eq!(analyses[0].sentences, stored);

        // Stored ranges are taken as they are (a section embedded sentence by sentence keeps
        // its vectors in line with them), not segmented again.
        section.sentences = vec![0..18, 19..text.len() as u32];
        let (analyses, _) = analyze(std::slice::from_ref(&section), test_minilm(), &cache());
        assert_eq!(analyses[0].sentences, section.sentences);
    }

    #[test]
    fn missing_or_unusable_stored_sentences_are_segmented_again() {
        let text = "Première phrase. Deuxième phrase.";
        let end = text.len() as u32;
        for stored in [
            vec![],
            one(0..end + 1),
            vec![10..20, 0..5],
            // Inside the two bytes of `è`.
            one(0..6),
            one(Range { start: 5, end: 2 }),
        ] {
            let mut section = test_section_hit(1.0, text);
            section.sentences = stored.clone();
            let (analyses, _) = analyze(std::slice::from_ref(&section), test_minilm(), &cache());
            assert_eq!(analyses[0].sentences, computed(text), "stored {stored:?}");
        }
    }

    #[test]
    fn a_key_covers_the_tokenizer_the_text_and_the_stored_sentences() {
        let tokenizer = tokenizer_key(test_minilm());
        let mut section = test_section_hit(1.0, "One. Two.");
        section.sentences = vec![0..4, 5..9];
        let key = SectionKey::of(tokenizer, &section);
        assert_eq!(key, SectionKey::of(tokenizer, &section.clone()));
        assert_ne!(key, SectionKey::of(tokenizer ^ 1, &section));
        let mut other = section.clone();
        other.sentences = one(0..9);
        assert_ne!(key, SectionKey::of(tokenizer, &other));
        other.sentences.clear();
        assert_ne!(key, SectionKey::of(tokenizer, &other));
        let mut text = section.clone();
        text.text = "One. Two!".into();
        assert_ne!(key, SectionKey::of(tokenizer, &text));

        // Sections that agree share an entry: the second is a hit.
        let cache = cache();
        let (_, misses) = analyze(std::slice::from_ref(&section), test_minilm(), &cache);
        assert_eq!(misses, 1);
        let (_, misses) = analyze(&[section.clone(), section], test_minilm(), &cache);
        assert_eq!(misses, 0);
        let (_, misses) = analyze(std::slice::from_ref(&other), test_minilm(), &cache);
        assert_eq!(misses, 1);
    }
}
