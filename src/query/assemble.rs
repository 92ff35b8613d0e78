//! The assemble stage: passages in the order asked for, as chunks with their text, context
//! (what pack counted before each span: [`SpanContexts`]) and byte and code-point offsets in the
//! document.

use super::context::SpanContexts;
use super::spans::push_text;
use super::{PackedSpan, Passage};
use crate::index::SectionHit;
use crate::types::{ResultOrder, RetrievedChunk};

/// The chunks of `passages` (of `spans`, as [`super::join::join`] left them), best first or in
/// position order.
#[tracing::instrument(level = "debug", skip_all, fields(passages = passages.len(), order = ?order))]
pub fn assemble(
    spans: &[PackedSpan],
    passages: &mut [Passage],
    hits: &[SectionHit],
    order: ResultOrder,
    contexts: &SpanContexts,
) -> Vec<RetrievedChunk> {
    if order == ResultOrder::Position {
        order_by_position(spans, passages, hits);
    }
    passages
        .iter()
        .map(|passage| chunk_of(&spans[passage.parts.clone()], passage, hits, contexts))
        .collect()
}

/// Documents in the order of their best passage; passages of one document in document order.
fn order_by_position(spans: &[PackedSpan], passages: &mut [Passage], hits: &[SectionHit]) {
    let first_hit = |passage: &Passage| &hits[spans[passage.parts.start].hit_index as usize];
    let mut document_rank: Vec<(&str, usize)> = Vec::new();
    for passage in passages.iter() {
        let doc_id = first_hit(passage).doc_id.as_str();
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
    passages.sort_by_key(|passage| {
        let hit = first_hit(passage);
        let start = spans[passage.parts.start].start;
        (rank_of(&hit.doc_id), hit.byte_start + start as u64)
    });
}

/// The chunk of the passage made of `parts`: where it lies is its first part's section, how it
/// scores its best part's.
fn chunk_of(
    parts: &[PackedSpan],
    passage: &Passage,
    hits: &[SectionHit],
    contexts: &SpanContexts,
) -> RetrievedChunk {
    let (first, last) = (&parts[0], &parts[parts.len() - 1]);
    let best = parts.iter().fold(
        first,
        |best, part| if part.score > best.score { part } else { best },
    );
    let (hit, last_hit) = (
        &hits[first.hit_index as usize],
        &hits[last.hit_index as usize],
    );
    let mut text = String::new();
    push_text(&mut text, parts, hits);
    let char_start = hit.char_start + hit.text[..first.start as usize].chars().count() as u64;
    RetrievedChunk {
        doc_id: hit.doc_id.clone(),
        section_ordinal: hit.ordinal,
        heading_path: hit.heading_path.clone(),
        doc_title: hit.doc_title.clone(),
        context: contexts.context(first.hit_index, &hit.text, first.header),
        bytes: hit.byte_start + first.start as u64..last_hit.byte_start + last.end as u64,
        chars: char_start..char_start + text.chars().count() as u64,
        text,
        token_count: passage.token_count,
        score: best.score,
        parts: best.parts,
        strategy: best.strategy,
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
            doc_id: doc_id.into(),
            byte_start,
            char_start,
            ..crate::query::test_section_hit(0.0, text)
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

    /// Each span a passage of its own, as when nothing joins.
    fn alone(spans: &[PackedSpan]) -> Vec<Passage> {
        (0..spans.len())
            .map(|i| Passage {
                parts: i..i + 1,
                token_count: spans[i].token_count,
            })
            .collect()
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
        let by_score = assemble(&spans, &mut alone(&spans), &hits, ResultOrder::Score, &none);
        let order: Vec<&str> = by_score.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(order, ["later", "only", "first"]);
        let by_position = assemble(
            &spans,
            &mut alone(&spans),
            &hits,
            ResultOrder::Position,
            &none,
        );
        let order: Vec<&str> = by_position.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(order, ["first", "later", "only"]);
    }

    #[test]
    fn offsets_are_in_the_document_in_bytes_and_code_points() {
        let hits = vec![hit("d", "héllo wörld", 10, 8)];
        let start = "héllo ".len() as u32;
        let spans = [span(0, start, "héllo wörld".len() as u32, 1.0)];
        let chunks = assemble(
            &spans,
            &mut alone(&spans),
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
