//! The rechunk stage: re-chunk only the retrieved sections, cutting on their token offsets. The semantic
//! strategy reads the stored sentence vectors: no model pass.
//!
//! A query may cut its sections at several sizes (`plan::chunk_sizes`: when neither the
//! request nor the collection sets one, half the budget's chunk size, that size and twice it). The
//! candidates of all sizes are scored together and the packer takes the best, merging what
//! overlaps, so a question answered by one sentence gets that sentence and one answered by a
//! paragraph gets the paragraph.

use std::sync::Arc;

use super::{Candidate, SectionAnalysis};
use crate::chunk::{self, ChunkOptions, ChunkSpan, SemanticInput, SemanticThreshold, Strategy};
use crate::embed::QuantizedVectors;
use crate::index::SectionHit;

/// The candidates of every section, cut with `options` at each of `sizes` (its `max_size` when
/// `sizes` is empty): each distinct span of a section once, sections in hit order.
#[tracing::instrument(level = "debug", skip_all, fields(sections = hits.len(), strategy = ?options.strategy, ?sizes))]
pub fn rechunk(
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    options: &ChunkOptions,
    sizes: &[u32],
    semantic_threshold: SemanticThreshold,
) -> Vec<Candidate> {
    let single = [options.max_size];
    let sizes = if sizes.is_empty() { &single[..] } else { sizes };
    let mut sized = options.clone();
    let mut candidates = Vec::new();
    let mut spans: Vec<ChunkSpan> = Vec::new();
    let mut section_spans: Vec<ChunkSpan> = Vec::new();
    let mut similarities: Vec<f32> = Vec::new();
    for (section, (hit, analysis)) in hits.iter().zip(analyses).enumerate() {
        let has_similarities = options.strategy == Strategy::Semantic
            && neighbour_similarities(hit, &mut similarities);
        section_spans.clear();
        for &size in sizes {
            sized.max_size = size;
            let semantic = has_similarities.then(|| SemanticInput {
                sentences: &hit.sentences,
                similarities: &similarities,
                threshold: semantic_threshold,
                min_tokens: (size / 8).max(1),
            });
            chunk::chunk_section_with_sentences(
                &hit.text,
                &analysis.tokens,
                &analysis.sentences,
                &sized,
                semantic.as_ref(),
                &mut spans,
            );
            section_spans.extend_from_slice(&spans);
        }
        if sizes.len() > 1 {
            // Sizes cut many of the same spans (a short section is one chunk at every size).
            section_spans.sort_by_key(|span| (span.start, span.end));
            section_spans.dedup_by_key(|span| (span.start, span.end));
        }
        candidates.extend(
            section_spans
                .iter()
                .map(|span| Candidate::unscored(section as u32, span)),
        );
    }
    candidates
}

/// Cosine of each stored sentence vector with the next; false when the section has none.
fn neighbour_similarities(hit: &SectionHit, out: &mut Vec<f32>) -> bool {
    out.clear();
    let Ok(vectors) = QuantizedVectors::from_bytes(&hit.sentence_vectors) else {
        return false;
    };
    if vectors.len() != hit.sentences.len() || vectors.len() < 2 {
        return false;
    }
    let mut previous = vec![0.0; vectors.dim()];
    let mut current = vec![0.0; vectors.dim()];
    if vectors.row_into(0, &mut previous).is_err() {
        return false;
    }
    for row in 1..vectors.len() {
        if vectors.row_into(row, &mut current).is_err() {
            return false;
        }
        out.push(crate::embed::cosine(&previous, &current));
        std::mem::swap(&mut previous, &mut current);
    }
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::chunk::Unit;
    use crate::tokenizer::BudgetTokenizer;

    fn tokenizer() -> &'static BudgetTokenizer {
        crate::query::test_minilm()
    }

    fn analysed(texts: &[&str]) -> (Vec<SectionHit>, Vec<Arc<SectionAnalysis>>) {
        let hits: Vec<SectionHit> = texts
            .iter()
            .map(|text| crate::query::test_section_hit(1.0, text))
            .collect();
        let analyses = hits
            .iter()
            .map(|hit| crate::query::test_analysis(hit, tokenizer()))
            .collect();
        (hits, analyses)
    }

    fn places(candidates: &[Candidate]) -> Vec<(u32, u32, u32)> {
        let mut places: Vec<_> = candidates
            .iter()
            .map(|c| (c.hit_index, c.start, c.end))
            .collect();
        places.sort_unstable();
        places
    }

    #[test]
    fn several_sizes_give_the_chunks_of_each_size_once() {
        let (hits, analyses) = analysed(&[
            "The plane iron is sharpened first. Then the cap iron is set close to its edge. \
             The mouth is narrowed for figured wood. A jack plane takes the rough off. \
             A smoothing plane follows it.",
            "Short.",
        ]);
        let options = ChunkOptions {
            strategy: Strategy::Sentence,
            max_size: 16,
            overlap: 0,
            unit: Unit::Tokens,
            separators: None,
        };
        let threshold = SemanticThreshold::default();
        let alone = |size| {
            let options = ChunkOptions {
                max_size: size,
                ..options.clone()
            };
            places(&rechunk(&hits, &analyses, &options, &[], threshold))
        };
        let mixed = rechunk(&hits, &analyses, &options, &[16, 8, 32], threshold);
        let mixed_places = places(&mixed);
        let mut expected: Vec<_> = [alone(16), alone(8), alone(32)].concat();
        expected.sort_unstable();
        expected.dedup();
        assert_eq!(mixed_places, expected);
        // The sizes differ where the section is long, and a short section is one chunk once.
        assert!(alone(8).len() > alone(32).len());
        assert_eq!(mixed.iter().filter(|c| c.hit_index == 1).count(), 1);
        assert!(mixed.iter().all(|c| c.token_count <= 32));
        // Sections stay in hit order, so scoring meets each section once.
        assert!(mixed.windows(2).all(|w| w[0].hit_index <= w[1].hit_index));
        // No sizes: the options' own.
        assert_eq!(
            places(&rechunk(&hits, &analyses, &options, &[16], threshold)),
            alone(16)
        );
    }
}
