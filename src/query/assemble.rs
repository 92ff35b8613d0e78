//! The assemble stage: packed spans in the order asked for, as chunks with their text, context
//! and byte and code-point offsets in the document.

use super::PackedSpan;
use crate::index::SectionHit;
use crate::types::{ResultOrder, RetrievedChunk};

#[tracing::instrument(level = "debug", skip_all, fields(spans = spans.len(), order = ?order))]
pub fn assemble(
    spans: &mut [PackedSpan],
    hits: &[SectionHit],
    order: ResultOrder,
) -> Vec<RetrievedChunk> {
    if order == ResultOrder::Position {
        order_by_position(spans, hits);
    }
    spans.iter().map(|span| chunk_of(span, hits)).collect()
}

/// Documents in the order of their best span; spans of one document in document order.
fn order_by_position(spans: &mut [PackedSpan], hits: &[SectionHit]) {
    let mut document_rank: Vec<(&str, usize)> = Vec::new();
    for span in spans.iter() {
        let doc_id = hits[span.hit_index as usize].doc_id.as_str();
        if !document_rank.iter().any(|(id, _)| *id == doc_id) {
            document_rank.push((doc_id, document_rank.len()));
        }
    }
    let rank_of = |doc_id: &str| {
        document_rank
            .iter()
            .find(|(id, _)| *id == doc_id)
            .map_or(usize::MAX, |(_, r)| *r)
    };
    spans.sort_by_key(|span| {
        let hit = &hits[span.hit_index as usize];
        (rank_of(&hit.doc_id), hit.byte_start + span.start as u64)
    });
}

fn chunk_of(span: &PackedSpan, hits: &[SectionHit]) -> RetrievedChunk {
    let hit = &hits[span.hit_index as usize];
    let (start, end) = (span.start as usize, span.end as usize);
    let text = &hit.text[start..end];
    let chars_before = hit.text[..start].chars().count() as u64;
    let char_start = hit.char_start + chars_before;
    RetrievedChunk {
        doc_id: hit.doc_id.clone(),
        section_ordinal: hit.ordinal,
        heading_path: hit.heading_path.clone(),
        doc_title: hit.doc_title.clone(),
        text: text.to_string(),
        context: span.header.map_or_else(String::new, |(a, b)| {
            hit.text[a as usize..b as usize].to_string()
        }),
        bytes: hit.byte_start + start as u64..hit.byte_start + end as u64,
        chars: char_start..char_start + text.chars().count() as u64,
        token_count: span.token_count,
        score: span.score,
        parts: span.parts,
        strategy: span.strategy,
        metadata: hit.metadata.clone(),
    }
}
