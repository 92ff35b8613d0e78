//! The rechunk stage: re-chunk only the retrieved sections, cutting on their token offsets. The semantic
//! strategy reads the stored sentence vectors: no model pass.

use std::sync::Arc;

use super::{Candidate, SectionAnalysis};
use crate::chunk::{self, ChunkOptions, ChunkSpan, SemanticInput, SemanticThreshold, Strategy};
use crate::embed::QuantizedVectors;
use crate::index::SectionHit;

#[tracing::instrument(level = "debug", skip_all, fields(sections = hits.len(), strategy = ?options.strategy, max_size = options.max_size))]
pub fn rechunk(
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    options: &ChunkOptions,
    semantic_threshold: SemanticThreshold,
) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    let mut spans: Vec<ChunkSpan> = Vec::new();
    let mut similarities: Vec<f32> = Vec::new();
    for (section, (hit, analysis)) in hits.iter().zip(analyses).enumerate() {
        let semantic = if options.strategy == Strategy::Semantic
            && neighbour_similarities(hit, &mut similarities)
        {
            Some(SemanticInput {
                sentences: &hit.sentences,
                similarities: &similarities,
                threshold: semantic_threshold,
                min_tokens: (options.max_size / 8).max(1),
            })
        } else {
            None
        };
        chunk::chunk_section_with_sentences(
            &hit.text,
            &analysis.tokens,
            &analysis.sentences,
            options,
            semantic.as_ref(),
            &mut spans,
        );
        candidates.extend(
            spans
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
