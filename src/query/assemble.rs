//! The assemble stage: packed spans in the order asked for, as chunks with their text, context
//! (what pack counted before each span: [`SpanContexts`]) and byte and code-point offsets in the
//! document.

use super::context::SpanContexts;
use super::PackedSpan;
use crate::index::SectionHit;
use crate::types::{ResultOrder, RetrievedChunk};

#[tracing::instrument(level = "debug", skip_all, fields(spans = spans.len(), order = ?order))]
pub fn assemble(
    spans: &mut [PackedSpan],
    hits: &[SectionHit],
    order: ResultOrder,
    contexts: &SpanContexts,
) -> Vec<RetrievedChunk> {
    if order == ResultOrder::Position {
        order_by_position(spans, hits);
    }
    spans
        .iter()
        .map(|span| chunk_of(span, hits, contexts))
        .collect()
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

fn chunk_of(span: &PackedSpan, hits: &[SectionHit], contexts: &SpanContexts) -> RetrievedChunk {
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
        context: contexts.context(span.hit_index, &hit.text, span.header),
        bytes: hit.byte_start + start as u64..hit.byte_start + end as u64,
        chars: char_start..char_start + text.chars().count() as u64,
        token_count: span.token_count,
        score: span.score,
        parts: span.parts,
        strategy: span.strategy,
        metadata: hit.metadata.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Strategy;
    use crate::types::ScoreParts;

    fn hit(doc_id: &str, text: &str, byte_start: u64, char_start: u64) -> SectionHit {
        SectionHit {
            score: 0.0,
            doc_id: doc_id.into(),
            ordinal: 0,
            version: 0,
            doc_title: String::new(),
            heading_path: Vec::new(),
            text: text.into(),
            byte_start,
            char_start,
            metadata: Default::default(),
            section_key: 0,
            sentences: Vec::new(),
            sentence_vectors: Vec::new(),
        }
    }

    fn span(hit_index: u32, start: u32, end: u32, score: f32) -> PackedSpan {
        PackedSpan {
            hit_index,
            start,
            end,
            token_count: 1,
            header: None,
            score,
            parts: ScoreParts::default(),
            strategy: Strategy::Sentence,
        }
    }

    #[test]
    fn position_order_keeps_documents_by_best_span_and_spans_in_document_order() {
        let hits = vec![
            hit("b", "later part of b", 100, 90),
            hit("a", "only part of a", 0, 0),
            hit("b", "first part of b", 0, 0),
        ];
        let none = SpanContexts::default();
        // Best first, as packed: b's later section, then a, then b's first section.
        let spans = [span(0, 0, 5, 3.0), span(1, 0, 4, 2.0), span(2, 0, 5, 1.0)];
        let by_score = assemble(&mut spans.clone(), &hits, ResultOrder::Score, &none);
        let order: Vec<&str> = by_score.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(order, ["later", "only", "first"]);
        let by_position = assemble(&mut spans.clone(), &hits, ResultOrder::Position, &none);
        let order: Vec<&str> = by_position.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(order, ["first", "later", "only"]);
    }

    #[test]
    fn offsets_are_in_the_document_in_bytes_and_code_points() {
        let hits = vec![hit("d", "héllo wörld", 10, 8)];
        let start = "héllo ".len() as u32;
        let chunks = assemble(
            &mut [span(0, start, "héllo wörld".len() as u32, 1.0)],
            &hits,
            ResultOrder::Score,
            &SpanContexts::default(),
        );
        assert_eq!(chunks[0].text, "wörld");
        assert_eq!(
            chunks[0].bytes,
            10 + start as u64..10 + "héllo wörld".len() as u64
        );
        assert_eq!(chunks[0].chars, 8 + 6..8 + 11);
    }
}
