//! Stage 3: re-chunk only the retrieved sections, cutting on their token offsets.

use std::sync::Arc;

use super::Candidate;
use crate::cache::SectionAnalysis;
use crate::chunk::{self, ChunkOptions, ChunkSpan};
use crate::index::SectionHit;
use crate::types::ScoreParts;

pub fn rechunk(
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    options: &ChunkOptions,
) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    let mut spans: Vec<ChunkSpan> = Vec::new();
    for (section, (hit, analysis)) in hits.iter().zip(analyses).enumerate() {
        chunk::chunk_section(&hit.text, &analysis.tokens, options, None, &mut spans);
        candidates.extend(spans.iter().map(|span| Candidate {
            section: section as u32,
            start: span.start,
            end: span.end,
            token_count: span.token_count,
            strategy: span.strategy,
            score: 0.0,
            parts: ScoreParts::default(),
        }));
    }
    candidates
}
