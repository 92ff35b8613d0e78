//! The join stage: spans of neighbouring sections that only whitespace separates in the
//! document are read as one passage, as the pack stage merges the spans of one section that
//! touch. Sections are cut at paragraph breaks, and a paragraph too long for one section is cut
//! between its sentences, so an answer running on over such a cut would otherwise come back as
//! two chunks. A section stores the whitespace before the next one
//! ([`crate::index::SectionHit::gap_after`]), so a passage's text is exactly the document's,
//! from its first span's start to its last span's end.
//!
//! A span that ends its section joins the span that starts the next section when both sections
//! are of one version of one document and under one heading path (so the chunk's heading path,
//! and in position order its heading line, is that of all of it), and the first's text and gap
//! run exactly up to the second's start. The passage is counted exactly with the budget
//! tokenizer, as its own text reads (its context, a line break, its text): the gap may cost
//! tokens, and a join that would take the answer past the budget is not made. The budget still
//! holds.

use std::ops::Range;

use super::spans::push_text;
use super::{FitInputs, PackedSpan, Passage};

/// Groups `spans` (best first, as packed and expanded) into passages, best first: the spans of
/// each passage are put next to each other, in document order.
#[tracing::instrument(level = "debug", skip_all, fields(spans = spans.len()))]
pub fn join(spans: &mut Vec<PackedSpan>, inputs: &FitInputs) -> Vec<Passage> {
    let next = links(spans, inputs);
    if next.iter().all(Option::is_none) {
        return (0..spans.len())
            .map(|i| Passage {
                parts: i..i + 1,
                token_count: spans[i].token_count,
            })
            .collect();
    }
    let mut has_previous = vec![false; spans.len()];
    for &following in next.iter().flatten() {
        has_previous[following] = true;
    }
    let mut used: u64 = spans.iter().map(|s| s.token_count as u64).sum();
    let mut order = Vec::with_capacity(spans.len());
    // (passage, the best rank among its parts)
    let mut passages: Vec<(Passage, usize)> = Vec::with_capacity(spans.len());
    for head in (0..spans.len()).filter(|&i| !has_previous[i]) {
        let mut start = order.len();
        let mut count = spans[head].token_count;
        let mut best = head;
        order.push(head);
        let mut last = head;
        while let Some(following) = next[last] {
            let joined = count_joined(&order[start..], count, following, spans, inputs);
            let freed = count as u64 + spans[following].token_count as u64;
            if used - freed + joined as u64 <= inputs.budget as u64 {
                used = used - freed + joined as u64;
                count = joined;
                best = best.min(following);
            } else {
                passages.push((passage(start..order.len(), count), best));
                start = order.len();
                count = spans[following].token_count;
                best = following;
            }
            order.push(following);
            last = following;
        }
        passages.push((passage(start..order.len(), count), best));
    }
    passages.sort_by_key(|&(_, best)| best);
    *spans = order.iter().map(|&i| spans[i]).collect();
    passages.into_iter().map(|(passage, _)| passage).collect()
}

fn passage(parts: Range<usize>, token_count: u32) -> Passage {
    Passage { parts, token_count }
}

/// For each span, the span it may be followed by in one passage.
fn links(spans: &[PackedSpan], inputs: &FitInputs) -> Vec<Option<usize>> {
    let hits = inputs.hits;
    let mut by_place: Vec<usize> = (0..spans.len()).collect();
    by_place.sort_by(|&a, &b| {
        let (ha, hb) = (
            &hits[spans[a].hit_index as usize],
            &hits[spans[b].hit_index as usize],
        );
        (ha.doc_id.as_str(), ha.version, ha.ordinal, spans[a].start).cmp(&(
            hb.doc_id.as_str(),
            hb.version,
            hb.ordinal,
            spans[b].start,
        ))
    });
    let mut next = vec![None; spans.len()];
    for pair in by_place.windows(2) {
        if joinable(&spans[pair[0]], &spans[pair[1]], inputs) {
            next[pair[0]] = Some(pair[1]);
        }
    }
    next
}

/// Whether `b` reads on from `a` with only `a`'s section's gap between them (module doc).
fn joinable(a: &PackedSpan, b: &PackedSpan, inputs: &FitInputs) -> bool {
    let (ha, hb) = (
        &inputs.hits[a.hit_index as usize],
        &inputs.hits[b.hit_index as usize],
    );
    ha.doc_id == hb.doc_id
        && ha.version == hb.version
        && hb.ordinal == ha.ordinal + 1
        && a.end as usize == ha.text.len()
        && b.start == 0
        && b.header.is_none()
        && ha.byte_start + (ha.text.len() + ha.gap_after.len()) as u64 == hb.byte_start
        && ha.heading_path == hb.heading_path
}

/// Exact count of what the caller reads of the passage of the spans `parts`, counted `count`,
/// followed by the span `following`. When the gap between them holds no token and both its ends
/// are cuts ([`crate::tokenizer::BudgetTokenizer::gap_adds_nothing`]: whitespace between ASCII
/// printable chars under WordPiece), that is `count` plus the span's own count, read from its
/// section's offsets; otherwise the passage is counted on its text.
fn count_joined(
    parts: &[usize],
    count: u32,
    following: usize,
    spans: &[PackedSpan],
    inputs: &FitInputs,
) -> u32 {
    let (last, next) = (&spans[parts[parts.len() - 1]], &spans[following]);
    let (last_hit, next_hit) = (
        &inputs.hits[last.hit_index as usize],
        &inputs.hits[next.hit_index as usize],
    );
    let (left_last, right_first) = (
        last_hit.text.as_bytes()[last.end as usize - 1],
        next_hit.text.as_bytes()[next.start as usize],
    );
    if inputs
        .tokenizer
        .gap_adds_nothing(left_last, &last_hit.gap_after, right_first)
    {
        let analysis = &inputs.analyses[next.hit_index as usize];
        let own = inputs.tokenizer.count_span(
            &next_hit.text,
            &analysis.tokens,
            analysis.spans_from_offsets,
            next.start as usize..next.end as usize,
        ) as u32;
        debug_assert_eq!(
            count + own,
            count_read(parts, following, spans, inputs),
            "{parts:?} then {following}"
        );
        return count + own;
    }
    count_read(parts, following, spans, inputs)
}

/// The count of what the caller reads of the spans `parts` followed by `following`, on its text.
fn count_read(parts: &[usize], following: usize, spans: &[PackedSpan], inputs: &FitInputs) -> u32 {
    let first = &spans[parts[0]];
    let mut read = inputs.contexts.context(
        first.hit_index,
        &inputs.hits[first.hit_index as usize].text,
        first.header,
    );
    if !read.is_empty() {
        read.push('\n');
    }
    let joined: Vec<PackedSpan> = parts
        .iter()
        .chain([&following])
        .map(|&i| spans[i])
        .collect();
    push_text(&mut read, &joined, inputs.hits);
    inputs.tokenizer.count(&read) as u32
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::chunk::Strategy;
    use crate::index::SectionHit;
    use crate::query::assemble::assemble;
    use crate::query::context::SpanContexts;
    use crate::query::SectionAnalysis;
    use crate::tokenizer::BudgetTokenizer;
    use crate::types::{ResultOrder, ScoreParts};

    /// Document "d" of `sections` and the gaps between them, as the index stores it: each
    /// section at its offsets, with its gap when that is whitespace.
    fn document(parts: &[&str]) -> (String, Vec<SectionHit>) {
        let mut text = String::new();
        let mut hits: Vec<SectionHit> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if i % 2 == 1 {
                text.push_str(part);
                continue;
            }
            if let Some(before) = hits.last_mut() {
                let end = (before.byte_start as usize) + before.text.len();
                let next = text.len();
                before.gap_after = crate::index::gap_after(&text, end, Some(next)).to_string();
            }
            hits.push(SectionHit {
                ordinal: hits.len() as u64,
                byte_start: text.len() as u64,
                char_start: text.chars().count() as u64,
                ..crate::query::test_section_hit(1.0, part)
            });
            text.push_str(part);
        }
        (text, hits)
    }

    /// The span of `text` in section `hit_index` (counted by [`joined`]).
    fn span(hits: &[SectionHit], hit_index: u32, text: &str, score: f32) -> PackedSpan {
        let start = hits[hit_index as usize].text.find(text).unwrap() as u32;
        PackedSpan {
            hit_index,
            start,
            end: start + text.len() as u32,
            token_count: 0,
            header: None,
            score,
            parts: ScoreParts::default(),
            strategy: Strategy::Sentence,
        }
    }

    fn joined(
        spans: &[PackedSpan],
        hits: &[SectionHit],
        budget: u32,
        tokenizer: &BudgetTokenizer,
        order: ResultOrder,
    ) -> Vec<crate::types::RetrievedChunk> {
        let contexts = SpanContexts::for_order(order, hits, tokenizer);
        let analyses: Vec<Arc<SectionAnalysis>> = hits
            .iter()
            .map(|hit| crate::query::test_analysis(hit, tokenizer))
            .collect();
        let inputs = FitInputs {
            hits,
            analyses: &analyses,
            budget,
            tokenizer,
            contexts: &contexts,
        };
        // Each span counted as pack counts it: its context, a line break, its text.
        let mut spans = spans.to_vec();
        for span in &mut spans {
            let hit = &hits[span.hit_index as usize];
            let mut read = contexts.context(span.hit_index, &hit.text, None);
            if !read.is_empty() {
                read.push('\n');
            }
            read.push_str(&hit.text[span.start as usize..span.end as usize]);
            span.token_count = tokenizer.count(&read) as u32;
        }
        let mut passages = join(&mut spans, &inputs);
        assemble(&spans, &mut passages, hits, order, &contexts)
    }

    #[test]
    fn an_answer_over_a_section_cut_comes_back_as_one_exact_chunk() {
        let (text, hits) = document(&[
            "Alpha begins here. The answer starts",
            "\n\n",
            "and ends here. Then more.",
            " ",
            "A third section.",
        ]);
        let tokenizer = crate::query::test_minilm();
        // Best first, as packed.
        let spans = [
            span(&hits, 0, "The answer starts", 3.0),
            span(&hits, 1, "and ends here.", 2.0),
            span(&hits, 2, "A third section.", 1.0),
        ];
        let chunks = joined(&spans, &hits, 100, tokenizer, ResultOrder::Score);
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        // "and ends here." does not end its section: the third section stays apart.
        assert_eq!(
            texts,
            ["The answer starts\n\nand ends here.", "A third section."]
        );
        let first = &chunks[0];
        let (start, end) = (first.bytes.start as usize, first.bytes.end as usize);
        assert_eq!(&text[start..end], first.text);
        assert_eq!(
            first.chars,
            start as u64..end as u64,
            "ASCII: chars are bytes"
        );
        assert_eq!(first.section_ordinal, 0, "where it starts");
        assert_eq!(first.score, 3.0, "its best part's score");
        assert_eq!(first.token_count as usize, tokenizer.count(&first.text));
    }

    #[test]
    fn a_run_of_sections_joins_and_keeps_the_rank_of_its_best_part() {
        let (text, hits) = document(&[
            "Other one.",
            "\n",
            "One a.",
            " ",
            "One b.",
            "\n\n",
            "One c.",
        ]);
        let tokenizer = crate::query::test_minilm();
        let spans = [
            span(&hits, 0, "Other one.", 5.0),
            span(&hits, 3, "One c.", 4.0),
            span(&hits, 1, "One a.", 1.0),
            span(&hits, 2, "One b.", 2.0),
        ];
        let chunks = joined(&spans, &hits, 100, tokenizer, ResultOrder::Score);
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        assert_eq!(chunks[0].text, text);
        assert_eq!(chunks[0].score, 5.0);
    }

    #[test]
    fn nothing_joins_across_text_of_no_section_another_version_or_a_partial_end() {
        let tokenizer = crate::query::test_minilm();
        // "|" lies between the sections: no gap is stored, and the offsets do not meet.
        let (_, hits) = document(&["First part.", " | ", "Second part."]);
        assert_eq!(hits[0].gap_after, "");
        let spans = [
            span(&hits, 0, "First part.", 2.0),
            span(&hits, 1, "Second part.", 1.0),
        ];
        assert_eq!(
            joined(&spans, &hits, 100, tokenizer, ResultOrder::Score).len(),
            2
        );

        let (_, mut hits) = document(&["First part.", " ", "Second part."]);
        hits[1].version = 7;
        assert_eq!(
            joined(&spans, &hits, 100, tokenizer, ResultOrder::Score).len(),
            2,
            "sections of two versions"
        );

        let (_, hits) = document(&["First part. Then.", " ", "Second part."]);
        let spans = [
            span(&hits, 0, "First part.", 2.0),
            span(&hits, 1, "Second part.", 1.0),
        ];
        assert_eq!(
            joined(&spans, &hits, 100, tokenizer, ResultOrder::Score).len(),
            2,
            "the first span does not end its section"
        );
    }

    #[test]
    fn only_sections_under_one_heading_path_join() {
        let tokenizer = crate::query::test_minilm();
        let (_, mut hits) = document(&["Install it.", "\n\n", "Then run it.", "\n\n", "Or not."]);
        hits[0].heading_path = vec!["Setup".into()];
        hits[1].heading_path = vec!["Setup".into()];
        hits[2].heading_path = vec!["Usage".into()];
        let spans = [
            span(&hits, 0, "Install it.", 3.0),
            span(&hits, 1, "Then run it.", 2.0),
            span(&hits, 2, "Or not.", 1.0),
        ];
        let by_score = joined(&spans, &hits, 100, tokenizer, ResultOrder::Score);
        let texts: Vec<&str> = by_score.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["Install it.\n\nThen run it.", "Or not."]);
        let chunks = joined(&spans, &hits, 100, tokenizer, ResultOrder::Position);
        let read: Vec<(&str, &str)> = chunks
            .iter()
            .map(|c| (c.context.as_str(), c.text.as_str()))
            .collect();
        assert_eq!(
            read,
            [
                ("Setup", "Install it.\n\nThen run it."),
                ("Usage", "Or not.")
            ]
        );
        for chunk in &chunks {
            let counted = tokenizer.count(&format!("{}\n{}", chunk.context, chunk.text));
            assert_eq!(chunk.token_count as usize, counted);
        }
    }

    #[test]
    fn a_join_the_budget_cannot_pay_for_is_not_made() {
        // In cl100k this gap costs tokens of its own: joined, the two spans read more than
        // apart.
        let tokenizer = BudgetTokenizer::resolve("cl100k_base", &crate::test_models_dir()).unwrap();
        let (_, hits) = document(&["Alpha beta.", "\n \n\t", "Gamma delta."]);
        let spans = [
            span(&hits, 0, "Alpha beta.", 2.0),
            span(&hits, 1, "Gamma delta.", 1.0),
        ];
        let apart = (tokenizer.count("Alpha beta.") + tokenizer.count("Gamma delta.")) as u32;
        let together = tokenizer.count("Alpha beta.\n \n\tGamma delta.") as u32;
        assert!(together > apart, "{together} against {apart}");

        let chunks = joined(&spans, &hits, apart, &tokenizer, ResultOrder::Score);
        assert_eq!(chunks.len(), 2, "a full budget keeps them apart");
        let chunks = joined(&spans, &hits, together, &tokenizer, ResultOrder::Score);
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].token_count, together);
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// The part of its section a span covers.
        #[derive(Clone, Copy, Debug)]
        enum Cover {
            Whole,
            Head,
            Tail,
            Nothing,
        }

        fn cover() -> impl proptest::strategy::Strategy<Value = Cover> {
            prop_oneof![
                Just(Cover::Whole),
                Just(Cover::Head),
                Just(Cover::Tail),
                Just(Cover::Nothing)
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            /// Spans of any sections of a document, any gaps between them: every chunk is the
            /// document's text at its offsets and counted exactly, the budget holds, every span
            /// lies in one chunk, and with budget to spare every run of spans that meet across
            /// whitespace gaps is one chunk.
            #[test]
            fn joined_chunks_are_exact_within_the_budget_and_complete(
                sections in prop::collection::vec(("[a-zé]{1,6}( [a-z東]{1,6}){0,5}[.]?", cover()), 1..7),
                gaps in prop::collection::vec(prop::sample::select(vec!["", " ", "\n\n", " \t\n ", "\u{a0}", "|", " x "]), 6),
                spare in any::<bool>(),
                tight in 0u32..64,
                use_cl100k in any::<bool>(),
            ) {
                let mut parts: Vec<&str> = Vec::new();
                for (i, (text, _)) in sections.iter().enumerate() {
                    if i > 0 {
                        parts.push(gaps[i - 1]);
                    }
                    parts.push(text);
                }
                let (document_text, hits) = document(&parts);
                let cl100k;
                let tokenizer = if use_cl100k {
                    cl100k = BudgetTokenizer::resolve("cl100k_base", &crate::test_models_dir()).unwrap();
                    &cl100k
                } else {
                    crate::query::test_minilm()
                };
                let mut spans = Vec::new();
                for (i, (text, cover)) in sections.iter().enumerate() {
                    let last_word = text.rfind(' ').unwrap_or(0);
                    let range = match cover {
                        Cover::Whole => 0..text.len(),
                        Cover::Head if last_word > 0 => 0..last_word,
                        Cover::Tail if last_word > 0 => last_word + 1..text.len(),
                        _ => continue,
                    };
                    let mut span = span(&hits, i as u32, &text[range.clone()], (i * 7 % 5) as f32);
                    span.start = range.start as u32;
                    span.end = range.end as u32;
                    spans.push(span);
                }
                spans.sort_by(|a, b| b.score.total_cmp(&a.score));
                let apart: u32 = spans
                    .iter()
                    .map(|s| tokenizer.count(&hits[s.hit_index as usize].text[s.start as usize..s.end as usize]) as u32)
                    .sum();
                let budget = if spare { apart * 2 + 16 } else { apart + tight % 3 };
                let chunks = joined(&spans, &hits, budget, tokenizer, ResultOrder::Score);

                let mut total = 0;
                for chunk in &chunks {
                    let (start, end) = (chunk.bytes.start as usize, chunk.bytes.end as usize);
                    prop_assert_eq!(document_text.get(start..end), Some(chunk.text.as_str()));
                    let char_start = document_text[..start].chars().count() as u64;
                    prop_assert_eq!(chunk.chars.clone(), char_start..char_start + chunk.text.chars().count() as u64);
                    prop_assert_eq!(chunk.token_count as usize, tokenizer.count(&chunk.text));
                    total += chunk.token_count;
                }
                prop_assert!(total <= budget, "{} > {}", total, budget);
                for s in &spans {
                    let hit = &hits[s.hit_index as usize];
                    let (start, end) = (hit.byte_start + s.start as u64, hit.byte_start + s.end as u64);
                    prop_assert!(chunks.iter().any(|c| c.bytes.start <= start && end <= c.bytes.end));
                }
                if spare {
                    // Runs: a span reaching its section's end, then one starting the next
                    // section, with whitespace (or nothing) between them in the document.
                    let mut by_place = spans.clone();
                    by_place.sort_by_key(|s| (s.hit_index, s.start));
                    let meets = |a: &PackedSpan, b: &PackedSpan| {
                        let (ha, hb) = (&hits[a.hit_index as usize], &hits[b.hit_index as usize]);
                        let end = (ha.byte_start + a.end as u64) as usize;
                        let start = (hb.byte_start + b.start as u64) as usize;
                        b.hit_index == a.hit_index + 1
                            && a.end as usize == ha.text.len()
                            && b.start == 0
                            && document_text[end..start].chars().all(char::is_whitespace)
                            && start - end <= crate::index::MAX_GAP_BYTES
                    };
                    let runs = 1 + by_place.windows(2).filter(|w| !meets(&w[0], &w[1])).count();
                    prop_assert_eq!(chunks.len(), if spans.is_empty() { 0 } else { runs });
                }
            }
        }
    }
}
