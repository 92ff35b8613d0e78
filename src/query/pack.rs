//! The pack stage: pack the best chunks into the caller's token budget.
//!
//! Greedy by score: a chunk is taken while the total still fits, merged with the chunks of its
//! section that it overlaps or touches (so no text is returned twice); chunks that do not fit are
//! skipped and smaller ones after them may still be taken. The section's token offsets give a
//! cheap lower bound that rejects hopeless candidates; a span that may fit is counted exactly with
//! the budget tokenizer on its own text (a span's standalone tokenization can differ from the
//! tokens it covers inside the section), so the budget is never exceeded. A span is counted with
//! the context the caller reads before it (its heading line in position order, the header of the
//! table it continues: [`SpanContexts`]).

use std::sync::Arc;

use super::context::SpanContexts;
use super::spans::overlaps_or_touches;
use super::{Candidate, PackedSpan, SectionAnalysis};
use crate::index::SectionHit;
use crate::tokenizer::BudgetTokenizer;
use crate::types::ChunkSelection;

/// `candidates` must be in the order they should be taken (best first). A candidate scoring
/// under `selection.min_score` is skipped, and so is one that would start a new span as a fragment
/// of its section (fewer than [`least_new_span_tokens`] tokens) or in a document already holding
/// `selection.max_chunks_per_document` spans (one that merges into a span of its section adds
/// none). Each span is counted with what `contexts` puts before it.
#[tracing::instrument(level = "debug", skip_all, fields(candidates = candidates.len(), budget))]
pub fn pack(
    candidates: &[Candidate],
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    budget: u32,
    tokenizer: &BudgetTokenizer,
    selection: &ChunkSelection,
    contexts: &SpanContexts,
) -> Vec<PackedSpan> {
    let largest = candidates.iter().map(|c| c.token_count).max().unwrap_or(0);
    let packer = Packer {
        hits,
        analyses,
        budget: budget as u64,
        tokenizer,
        selection,
        contexts,
        least_new_span: least_new_span_tokens(budget, largest),
    };
    let mut spans: Vec<PackedSpan> = Vec::new();
    let mut used: u64 = 0;
    let mut absorbed: Vec<usize> = Vec::new();
    for candidate in candidates {
        let Some((merged, freed)) = packer.merge(candidate, &spans, used, &mut absorbed) else {
            continue;
        };
        used = used - freed + merged.token_count as u64;
        absorbed.sort_unstable_by(|a, b| b.cmp(a));
        for &i in &absorbed {
            spans.swap_remove(i);
        }
        spans.push(merged);
    }
    spans.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.hit_index.cmp(&b.hit_index))
            .then(a.start.cmp(&b.start))
    });
    spans
}

/// What [`pack`] reads besides the spans it has packed so far.
struct Packer<'a> {
    hits: &'a [SectionHit],
    analyses: &'a [Arc<SectionAnalysis>],
    budget: u64,
    tokenizer: &'a BudgetTokenizer,
    selection: &'a ChunkSelection,
    contexts: &'a SpanContexts,
    /// [`least_new_span_tokens`] of the budget and the largest candidate.
    least_new_span: u32,
}

impl Packer<'_> {
    /// The span `candidate` makes when it is taken, merged with the packed spans of its section
    /// that it overlaps or touches (left in `absorbed`), and the tokens those spans held; `None`
    /// when it is not taken: it adds nothing, scores under `min_score`, would start a new span as
    /// a fragment or in a full document, or would take the `used` tokens past the budget.
    fn merge(
        &self,
        candidate: &Candidate,
        spans: &[PackedSpan],
        used: u64,
        absorbed: &mut Vec<usize>,
    ) -> Option<(PackedSpan, u64)> {
        if candidate.token_count == 0 || candidate.start >= candidate.end {
            return None;
        }
        if self
            .selection
            .min_score
            .is_some_and(|floor| candidate.score < floor.0)
        {
            return None;
        }
        let text = &self.hits[candidate.hit_index as usize].text;
        if collect_touching(spans, candidate, text, absorbed) {
            return None;
        }
        if absorbed.is_empty()
            && (is_fragment(candidate, text, self.least_new_span)
                || document_is_full(spans, self.hits, candidate, self.selection))
        {
            return None;
        }
        let (start, end) = widen_over_touching(spans, candidate, text, absorbed);
        let freed: u64 = absorbed.iter().map(|&i| spans[i].token_count as u64).sum();
        let header = merged_header(spans, absorbed, candidate, start);
        // Tokens wholly inside the span, as the section was tokenized. Its own tokenization can be
        // shorter (a word cut at the span's edge may become fewer pieces), so only a candidate
        // far over the budget is rejected without the exact count: at most half of the section's
        // tokens, less a few, are assumed to disappear.
        let analysis = &self.analyses[candidate.hit_index as usize];
        let covered = analysis.tokens.count_within(start as usize..end as usize) as u64;
        if used - freed + (covered / 2).saturating_sub(4) > self.budget {
            return None;
        }
        let merged_tokens = self.contexts.count(
            self.tokenizer,
            candidate.hit_index,
            text,
            analysis,
            header,
            (start, end),
        ) as u64;
        if used - freed + merged_tokens > self.budget {
            return None;
        }
        let mut merged = PackedSpan {
            hit_index: candidate.hit_index,
            start,
            end,
            token_count: merged_tokens as u32,
            header,
            score: candidate.score,
            parts: candidate.parts,
            strategy: candidate.strategy,
        };
        take_best_score(&mut merged, spans, absorbed);
        Some((merged, freed))
    }
}

/// The fewest tokens a chunk standing alone is returned with: a new span must hold
/// [`MIN_SPAN_TOKENS`] (less for a tiny budget or tiny chunks: [`least_new_span_tokens`]) unless
/// it is its whole section (a short document is returned as it is). A chunk that merges into a
/// span already taken may be smaller. What this keeps out: the head of a long sentence cut at a
/// comma ("Moreover,"), a stray citation tail ("2013) ."), a page number.
pub const MIN_SPAN_TOKENS: u32 = 8;

/// [`MIN_SPAN_TOKENS`], or an eighth of the budget, or half the largest candidate, whichever is
/// least: a tiny budget still takes what fits, and a caller who asks for 4-token chunks gets them.
pub fn least_new_span_tokens(budget: u32, largest_candidate: u32) -> u32 {
    MIN_SPAN_TOKENS.min(budget / 8).min(largest_candidate / 2)
}

/// True when `candidate`, a chunk of the section `text`, holds fewer than `least` tokens and is
/// not the whole section.
fn is_fragment(candidate: &Candidate, text: &str, least: u32) -> bool {
    candidate.token_count < least && !covers_whole_section(candidate.start, candidate.end, text)
}

/// True when the byte range `start..end` is all of the section `text`.
fn covers_whole_section(start: u32, end: u32, text: &str) -> bool {
    start == 0 && end as usize == text.len()
}

/// True when the candidate's document already holds `max_chunks_per_document` packed spans.
fn document_is_full(
    spans: &[PackedSpan],
    hits: &[SectionHit],
    candidate: &Candidate,
    selection: &ChunkSelection,
) -> bool {
    let Some(cap) = selection.max_chunks_per_document else {
        return false;
    };
    let doc_id = &hits[candidate.hit_index as usize].doc_id;
    let held = spans
        .iter()
        .filter(|span| &hits[span.hit_index as usize].doc_id == doc_id)
        .count();
    held >= cap as usize
}

/// Collects into `absorbed` the packed spans of the candidate's section that overlap or touch
/// it; true when one of them already holds the candidate whole (nothing to add).
fn collect_touching(
    spans: &[PackedSpan],
    candidate: &Candidate,
    text: &str,
    absorbed: &mut Vec<usize>,
) -> bool {
    absorbed.clear();
    for (i, span) in spans.iter().enumerate() {
        if span.hit_index != candidate.hit_index
            || !overlaps_or_touches(
                text,
                (span.start, span.end),
                (candidate.start, candidate.end),
            )
        {
            continue;
        }
        if span.start <= candidate.start && candidate.end <= span.end {
            return true;
        }
        absorbed.push(i);
    }
    false
}

/// The candidate's range widened over the spans in `absorbed`, which gains every further span
/// of the section that the widened range touches: merging can chain.
fn widen_over_touching(
    spans: &[PackedSpan],
    candidate: &Candidate,
    text: &str,
    absorbed: &mut Vec<usize>,
) -> (u32, u32) {
    let (mut start, mut end) = (candidate.start, candidate.end);
    loop {
        for &i in absorbed.iter() {
            start = start.min(spans[i].start);
            end = end.max(spans[i].end);
        }
        let before = absorbed.len();
        for (i, span) in spans.iter().enumerate() {
            if span.hit_index == candidate.hit_index
                && !absorbed.contains(&i)
                && overlaps_or_touches(text, (span.start, span.end), (start, end))
            {
                absorbed.push(i);
            }
        }
        if absorbed.len() == before {
            return (start, end);
        }
    }
}

/// The merged span continues the table its first piece continues, unless it now holds the
/// header itself (the header starts inside it).
fn merged_header(
    spans: &[PackedSpan],
    absorbed: &[usize],
    candidate: &Candidate,
    merged_start: u32,
) -> Option<(u32, u32)> {
    let mut first_piece = (candidate.start, candidate.header);
    for &i in absorbed {
        if spans[i].start < first_piece.0 {
            first_piece = (spans[i].start, spans[i].header);
        }
    }
    first_piece
        .1
        .filter(|&(header_start, _)| header_start < merged_start)
}

/// A merged span keeps the score, parts and strategy of its best piece.
fn take_best_score(merged: &mut PackedSpan, spans: &[PackedSpan], absorbed: &[usize]) {
    for &i in absorbed {
        if spans[i].score > merged.score {
            merged.score = spans[i].score;
            merged.parts = spans[i].parts;
            merged.strategy = spans[i].strategy;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fragment_is_not_packed_alone_but_joins_a_span_it_touches() {
        use crate::query::{test_section_hit, Candidate};
        let tokenizer =
            crate::tokenizer::BudgetTokenizer::resolve("minilm", &crate::test_models_dir())
                .expect("run scripts/fetch-models.sh");
        let text = "Moreover, the study ran from January to March in four cities. See table 9";
        let sentence_end = text.find(" See").unwrap();
        let hits = vec![test_section_hit(1.0, text)];
        let analyses = vec![Arc::new(SectionAnalysis {
            tokens: tokenizer.offsets(text),
            ..SectionAnalysis::default()
        })];
        let contexts = SpanContexts::for_order(crate::types::ResultOrder::Score, &hits, &tokenizer);
        let piece = |start: usize, end: usize, score: f32| Candidate {
            hit_index: 0,
            start: start as u32,
            end: end as u32,
            token_count: analyses[0].tokens.count_within(start..end) as u32,
            header: None,
            strategy: crate::chunk::Strategy::Sentence,
            score,
            parts: Default::default(),
        };
        let fragment = piece(0, "Moreover,".len(), 3.0);
        let sentence = piece("Moreover, ".len(), sentence_end, 2.0);
        let number = piece(text.len() - 1, text.len(), 1.0);
        let selection = ChunkSelection::default();
        let pack_with = |candidates: &[Candidate], budget: u32| {
            let spans = pack(
                candidates, &hits, &analyses, budget, &tokenizer, &selection, &contexts,
            );
            spans
                .iter()
                .map(|s| (s.start as usize, s.end as usize))
                .collect::<Vec<_>>()
        };
        // Beside a chunk of 11 tokens, pieces of one or two are fragments at a budget of 64: the
        // best two are left out, though they fit, and the sentence is taken alone.
        assert_eq!(
            pack_with(&[fragment, number, sentence], 64),
            vec![("Moreover, ".len(), sentence_end)]
        );
        // Once the sentence is taken, the fragment beside it joins it; the number stays out.
        assert_eq!(
            pack_with(&[sentence, fragment, number], 64),
            vec![(0, sentence_end)]
        );
        // A budget of 8 takes what fits, however small (an eighth of it is 1 token).
        assert_eq!(
            pack_with(&[fragment, sentence], 8),
            vec![(0, "Moreover,".len())]
        );
        // When every chunk is that small (a caller asked for tiny chunks), they are returned.
        assert_eq!(pack_with(&[fragment, number], 64).len(), 2);
        // A section of two tokens, beside that sentence, is no fragment: it is returned whole.
        let short = "Printer jammed";
        let both = vec![test_section_hit(1.0, text), test_section_hit(1.0, short)];
        let both_analyses = vec![
            analyses[0].clone(),
            Arc::new(SectionAnalysis {
                tokens: tokenizer.offsets(short),
                ..SectionAnalysis::default()
            }),
        ];
        let whole = Candidate {
            hit_index: 1,
            end: short.len() as u32,
            token_count: both_analyses[1].tokens.len() as u32,
            ..fragment
        };
        assert!(whole.token_count < MIN_SPAN_TOKENS);
        let contexts = SpanContexts::for_order(crate::types::ResultOrder::Score, &both, &tokenizer);
        let spans = pack(
            &[whole, sentence],
            &both,
            &both_analyses,
            64,
            &tokenizer,
            &selection,
            &contexts,
        );
        assert_eq!(spans.len(), 2, "{spans:?}");
    }
}

#[cfg(test)]
mod properties {
    use std::sync::{Arc, OnceLock};

    use proptest::prelude::{
        any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest, Just, ProptestConfig,
    };
    use proptest::strategy::Strategy as _;

    use proptest::test_runner::TestCaseError;

    use super::{pack, Candidate, PackedSpan, SectionAnalysis, SpanContexts};
    use crate::query::assemble::assemble;
    use crate::query::diversify::diversify;
    use crate::query::expand::expand;
    use crate::query::join::join;
    use crate::query::FitInputs;
    use crate::types::{ChunkSelection, ExactF32, ResultOrder};

    /// What must hold of any packed (or grown) spans: the floor and the per-document cap; then,
    /// the spans joined and assembled, the budget counted exactly (each chunk's
    /// `context + "\n" + text`, as the caller reads it), disjoint spans on char boundaries, every
    /// span inside one chunk, and each chunk's text equal to its document's text at the returned
    /// bytes and code points.
    /// The sections retrieved, their analyses, and the documents they are of (id, text).
    struct Retrieved<'a> {
        hits: &'a [SectionHit],
        analyses: &'a [Arc<SectionAnalysis>],
        documents: &'a [(&'a str, String)],
    }

    fn check_spans(
        spans: &[PackedSpan],
        retrieved: &Retrieved,
        budget: u32,
        selection: &ChunkSelection,
        order: ResultOrder,
        contexts: &SpanContexts,
    ) -> Result<(), TestCaseError> {
        let Retrieved {
            hits,
            analyses,
            documents,
        } = *retrieved;
        if let Some(floor) = selection.min_score {
            for s in spans {
                prop_assert!(s.score >= floor.0, "{s:?} under {floor:?}");
            }
        }
        if let Some(cap) = selection.max_chunks_per_document {
            for doc_id in ["d0", "d1"] {
                let held = spans
                    .iter()
                    .filter(|s| hits[s.hit_index as usize].doc_id == doc_id)
                    .count();
                prop_assert!(held <= cap as usize, "{held} spans of {doc_id}, cap {cap}");
            }
        }
        let mut joined = spans.to_vec();
        let inputs = FitInputs {
            hits,
            analyses,
            budget,
            tokenizer: tokenizer(),
            contexts,
        };
        let mut passages = join(&mut joined, &inputs);
        let chunks = assemble(&joined, &mut passages, hits, order, contexts);
        prop_assert!(chunks.len() <= spans.len());
        let mut total = 0usize;
        for chunk in &chunks {
            let read = if chunk.context.is_empty() {
                chunk.text.clone()
            } else {
                format!("{}\n{}", chunk.context, chunk.text)
            };
            let count = tokenizer().count(&read);
            prop_assert_eq!(count, chunk.token_count as usize, "{:?}", read);
            total += count;
            let heading = hits
                .iter()
                .find(|hit| hit.doc_id == chunk.doc_id && hit.ordinal == chunk.section_ordinal);
            let heading = heading
                .map(|hit| hit.heading_path.join(" > "))
                .unwrap_or_default();
            if order == ResultOrder::Position && !heading.trim().is_empty() {
                prop_assert!(
                    chunk.context.starts_with(&heading),
                    "{chunk:?} without its heading line"
                );
            }
            let document = &documents
                .iter()
                .find(|(id, _)| *id == chunk.doc_id)
                .unwrap()
                .1;
            let (start, end) = (chunk.bytes.start as usize, chunk.bytes.end as usize);
            prop_assert_eq!(
                document.get(start..end),
                Some(chunk.text.as_str()),
                "{:?} is not its document's text",
                chunk
            );
            let char_start = document[..start].chars().count() as u64;
            prop_assert_eq!(
                chunk.chars.clone(),
                char_start..char_start + chunk.text.chars().count() as u64
            );
        }
        for (i, a) in chunks.iter().enumerate() {
            for b in &chunks[i + 1..] {
                prop_assert!(
                    a.doc_id != b.doc_id
                        || a.bytes.end <= b.bytes.start
                        || b.bytes.end <= a.bytes.start,
                    "overlapping chunks {a:?} {b:?}"
                );
            }
        }
        for s in spans {
            if let Some(header) = s.header {
                prop_assert!(header.1 <= s.start, "context {header:?} inside {s:?}");
            }
            let hit = &hits[s.hit_index as usize];
            let bytes = hit.byte_start + s.start as u64..hit.byte_start + s.end as u64;
            let inside = chunks.iter().any(|c| {
                c.doc_id == hit.doc_id && c.bytes.start <= bytes.start && bytes.end <= c.bytes.end
            });
            prop_assert!(inside, "{s:?} in no chunk");
        }
        prop_assert!(total <= budget as usize, "{total} > {budget}");
        for (i, a) in spans.iter().enumerate() {
            let text = &hits[a.hit_index as usize].text;
            prop_assert!(a.start < a.end && (a.end as usize) <= text.len());
            prop_assert!(
                text.is_char_boundary(a.start as usize) && text.is_char_boundary(a.end as usize)
            );
            for b in &spans[i + 1..] {
                prop_assert!(
                    a.hit_index != b.hit_index || a.end <= b.start || b.end <= a.start,
                    "overlap {a:?} {b:?}"
                );
            }
        }
        Ok(())
    }

    /// Candidates by place, to compare two orders of the same candidates.
    fn sorted_by_place(candidates: &[Candidate]) -> Vec<(u32, u32, u32)> {
        let mut places: Vec<(u32, u32, u32)> = candidates
            .iter()
            .map(|c| (c.hit_index, c.start, c.end))
            .collect();
        places.sort_unstable();
        places
    }
    use crate::chunk::{chunk_section, ChunkOptions, ChunkSpan, Unit};
    use crate::index::SectionHit;
    use crate::tokenizer::BudgetTokenizer;
    use crate::tokens::MAX_BYTES_PER_TOKEN;

    fn tokenizer() -> &'static BudgetTokenizer {
        crate::query::test_minilm()
    }

    fn section(text: &str) -> SectionHit {
        crate::query::test_section_hit(1.0, text)
    }

    /// A section per text, each with its analysis by `tokenizer` (offsets only).
    fn sections_and_analyses(
        texts: &[String],
        tokenizer: &BudgetTokenizer,
    ) -> (Vec<SectionHit>, Vec<Arc<SectionAnalysis>>) {
        let hits: Vec<SectionHit> = texts.iter().map(|t| section(t)).collect();
        let analyses = hits
            .iter()
            .map(|hit| {
                Arc::new(SectionAnalysis {
                    tokens: tokenizer.offsets(&hit.text),
                    terms: Vec::new(),
                    sentences: Vec::new(),
                    spans_from_offsets: tokenizer.spans_count_from_offsets(&hit.text),
                })
            })
            .collect();
        (hits, analyses)
    }

    /// A section of document `doc_id`.
    fn document_section(doc_id: &str, text: &str) -> SectionHit {
        SectionHit {
            doc_id: doc_id.into(),
            ..section(text)
        }
    }

    /// Arbitrary Unicode with plenty of whitespace, punctuation, combining marks and emoji.
    fn text_strategy() -> impl proptest::strategy::Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                4 => "[a-zA-Z]{1,8}",
                2 => Just(" ".to_string()),
                1 => Just(". ".to_string()),
                1 => Just("\n\n".to_string()),
                1 => Just("\n\n| name | value |\n|---|---|\n| a | 1 |\n| b | 2 |\n| c | 3 |\n\n".to_string()),
                1 => "\\PC{1,3}",
                1 => prop::sample::select(vec!["é", "e\u{301}", "東京", "👩‍👩‍👧", "مرحبا", "।", "𝔘"]).prop_map(str::to_string),
            ],
            0..120,
        )
        .prop_map(|parts| parts.concat())
    }

    /// What lies between two sections of a document: whitespace (what a section stores as its
    /// gap), nothing (sections that touch), or text of no section.
    fn gap_strategy() -> impl proptest::strategy::Strategy<Value = String> {
        prop::sample::select(vec!["", " ", "\n\n", " \t\n ", "\u{a0}", "|", " | "])
            .prop_map(str::to_string)
    }

    /// Words with, now and then, a run of hundreds or thousands of one char (a letter, an emoji,
    /// a CJK char, a combining mark, a control char, whitespace): the huge tokens of issue 11.
    fn text_with_runs() -> impl proptest::strategy::Strategy<Value = String> {
        let run = (
            prop::sample::select(vec!["b", "😀", "東", "\u{301}", "\u{1}", " ", "-"]),
            0usize..4000,
        )
            .prop_map(|(unit, count)| unit.repeat(count));
        prop::collection::vec(
            prop_oneof![
                4 => "[a-zA-Z]{1,8}",
                2 => Just(" ".to_string()),
                1 => Just(". ".to_string()),
                2 => run,
            ],
            0..10,
        )
        .prop_map(|parts| parts.concat())
    }

    /// Heading paths of zero to two titles: words, titles ending in punctuation or in a char
    /// that is not ASCII (where a line break is no known cut), blank ones.
    fn heading_path_strategy() -> impl proptest::strategy::Strategy<Value = Vec<String>> {
        prop::collection::vec(
            prop_oneof![
                3 => "[a-zA-Z]{1,8}( [a-zA-Z]{1,8})?",
                1 => Just("Why?".to_string()),
                1 => Just("東京".to_string()),
                1 => Just(" ".to_string()),
                1 => "\\PC{1,4}",
            ],
            0..3,
        )
    }

    /// A deterministic pseudo-random score for chunk `chunk` of section `section`.
    fn pseudo_random_score(seed: u64, section: usize, chunk: usize) -> f32 {
        ((seed ^ (section as u64 * 7919 + chunk as u64)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40)
            as f32
    }

    fn cl100k() -> &'static BudgetTokenizer {
        static TOKENIZER: OnceLock<BudgetTokenizer> = OnceLock::new();
        TOKENIZER.get_or_init(|| {
            BudgetTokenizer::resolve("cl100k_base", &crate::test_models_dir()).unwrap()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the text, returned bytes stay proportional to the budget: every chunk holds
        /// at most `MAX_BYTES_PER_TOKEN` bytes per token it counts, so the packed text is at most
        /// `budget * MAX_BYTES_PER_TOKEN` bytes (before the bound, one run was one token).
        #[test]
        fn packed_bytes_are_at_most_the_budget_times_the_bound(
            texts in prop::collection::vec(text_with_runs(), 1..3),
            max_size in 1u32..64,
            budget in 1u32..200,
            use_cl100k in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let tokenizer = if use_cl100k { cl100k() } else { tokenizer() };
            let (hits, analyses) = sections_and_analyses(&texts, tokenizer);
            let options = ChunkOptions {
                strategy: crate::chunk::Strategy::Fixed,
                max_size,
                overlap: 0,
                unit: Unit::Tokens,
                separators: None,
            };
            let mut candidates = Vec::new();
            let mut spans: Vec<ChunkSpan> = Vec::new();
            for (section, (hit, analysis)) in hits.iter().zip(&analyses).enumerate() {
                chunk_section(&hit.text, &analysis.tokens, &options, None, &mut spans);
                for (i, span) in spans.iter().enumerate() {
                    let chunk_bytes = (span.end - span.start) as usize;
                    prop_assert!(
                        chunk_bytes <= (span.token_count as usize).max(1) * MAX_BYTES_PER_TOKEN,
                        "a chunk of {} bytes counts {} tokens", chunk_bytes, span.token_count
                    );
                    candidates.push(Candidate { score: pseudo_random_score(seed, section, i), ..Candidate::unscored(section as u32, span) });
                }
            }
            candidates.sort_by(|a, b| b.score.total_cmp(&a.score));
            let packed = pack(&candidates, &hits, &analyses, budget, tokenizer, &ChunkSelection::default(), &SpanContexts::default());
            let tokens: u32 = packed.iter().map(|s| s.token_count).sum();
            let bytes: usize = packed.iter().map(|s| (s.end - s.start) as usize).sum();
            prop_assert!(tokens <= budget);
            prop_assert!(
                bytes <= budget as usize * MAX_BYTES_PER_TOKEN,
                "{} bytes packed into a budget of {}", bytes, budget
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// With any of the caller's controls set (`min_score`, `max_chunks_per_document`,
        /// `diversity`), either order, and candidates of one size or of several overlapping
        /// sizes, the budget holds, spans are exact and disjoint, and every span honours the
        /// floor and its document's cap; then joined across sections, chunks stay exact and the
        /// budget holds.
        #[test]
        fn packing_never_exceeds_the_budget_and_never_repeats_text(
            texts in prop::collection::vec(text_strategy(), 1..4),
            gaps in prop::collection::vec(gap_strategy(), 3),
            first_of_d1 in 0usize..4,
            max_size in 1u32..40,
            structure in any::<bool>(),
            overlap_share in 0u32..100,
            budget in 1u32..200,
            seed in any::<u64>(),
            min_score in prop::option::of(0u32..(1 << 24)),
            max_chunks_per_document in prop::option::of(1u32..4),
            diversity_steps in prop_oneof![Just(0u32), 0u32..=4],
            with_vectors in any::<bool>(),
            by_position in any::<bool>(),
            heading_paths in prop::collection::vec(heading_path_strategy(), 4),
            one_heading in any::<bool>(),
            several_sizes in any::<bool>(),
        ) {
            let selection = ChunkSelection {
                min_score: min_score.map(|m| ExactF32(m as f32)),
                max_chunks_per_document,
                diversity: Some(ExactF32(diversity_steps as f32 / 4.0)),
            };
            // The sections before `first_of_d1` are document d0's, the others d1's, each
            // document its sections' texts (trimmed, as sections are) with a gap between them
            // (whitespace, nothing, or a "|" that belongs to no section): the cap counts by
            // document, and only sections whose gap is whitespace or nothing may be joined.
            let mut documents: Vec<(&str, String)> = Vec::new();
            let mut hits: Vec<SectionHit> = Vec::new();
            for (i, text) in texts.iter().map(|t| t.trim()).enumerate() {
                let doc_id = if i < first_of_d1 { "d0" } else { "d1" };
                if documents.last().is_none_or(|(id, _)| *id != doc_id) {
                    documents.push((doc_id, String::new()));
                } else {
                    let document = &mut documents.last_mut().unwrap().1;
                    let before = hits.last_mut().unwrap();
                    let end = document.len();
                    document.push_str(&gaps[i - 1]);
                    before.gap_after = crate::index::gap_after(document, end, Some(document.len())).to_string();
                }
                let document = &mut documents.last_mut().unwrap().1;
                let ordinal = hits.last().filter(|h| h.doc_id == doc_id).map_or(0, |h| h.ordinal + 1);
                hits.push(SectionHit {
                    ordinal,
                    heading_path: heading_paths[if one_heading { 0 } else { i }].clone(),
                    byte_start: document.len() as u64,
                    char_start: document.chars().count() as u64,
                    ..document_section(doc_id, text)
                });
                document.push_str(text);
            }
            let order = if by_position { ResultOrder::Position } else { ResultOrder::Score };
            let contexts = SpanContexts::for_order(order, &hits, tokenizer());
            let analyses: Vec<Arc<SectionAnalysis>> = hits
                .iter()
                .map(|hit| crate::query::test_analysis(hit, tokenizer()))
                .collect();
            let options = ChunkOptions {
                // Structure repeats table headers as context, which the budget must count.
                strategy: if structure { crate::chunk::Strategy::Structure } else { crate::chunk::Strategy::Fixed },
                max_size,
                overlap: overlap_share * (max_size - 1) / 100,
                unit: Unit::Tokens,
                separators: None,
            };
            let mut candidates = Vec::new();
            if several_sizes {
                // The candidates of a query whose sizes come from the budget: half, once and
                // twice the size, overlapping each other (`plan::chunk_sizes`).
                let sizes = [max_size, (max_size / 2).max(1), max_size * 2];
                candidates = crate::query::rechunk::rechunk(&hits, &analyses, &options, &sizes, Default::default());
                let mut in_section = (u32::MAX, 0);
                for c in &mut candidates {
                    in_section = if in_section.0 == c.hit_index { (c.hit_index, in_section.1 + 1) } else { (c.hit_index, 0) };
                    c.score = pseudo_random_score(seed, c.hit_index as usize, in_section.1);
                }
            } else {
                let mut spans: Vec<ChunkSpan> = Vec::new();
                for (section, (hit, analysis)) in hits.iter().zip(&analyses).enumerate() {
                    chunk_section(&hit.text, &analysis.tokens, &options, None, &mut spans);
                    for (i, span) in spans.iter().enumerate() {
                        candidates.push(Candidate { score: pseudo_random_score(seed, section, i), ..Candidate::unscored(section as u32, span) });
                    }
                }
            }
            candidates.sort_by(|a, b| b.score.total_cmp(&a.score));
            let vectors: Vec<Option<Vec<f32>>> = candidates
                .iter()
                .map(|c| with_vectors.then(|| {
                    let angle = (c.score as u64 % 7) as f32;
                    vec![angle.cos(), angle.sin()]
                }))
                .collect();
            let scored = candidates.clone();
            diversify(&mut candidates, &vectors, &hits, selection.diversity.map_or(0.0, |d| d.0), budget);
            prop_assert_eq!(sorted_by_place(&candidates), sorted_by_place(&scored));
            let packed = pack(&candidates, &hits, &analyses, budget, tokenizer(), &selection, &contexts);
            let retrieved = Retrieved { hits: &hits, analyses: &analyses, documents: &documents };
            check_spans(&packed, &retrieved, budget, &selection, order, &contexts)?;
            // No span is a fragment: each holds the fewest tokens a new span may start with, or
            // its whole section.
            let largest = candidates.iter().map(|c| c.token_count).max().unwrap_or(0);
            let least = super::least_new_span_tokens(budget, largest) as usize;
            for s in &packed {
                let held = analyses[s.hit_index as usize].tokens.count_within(s.start as usize..s.end as usize);
                let whole = super::covers_whole_section(s.start, s.end, &hits[s.hit_index as usize].text);
                prop_assert!(held >= least || whole, "{s:?} holds {held} tokens, fewer than {least}");
            }
            // The leftover grows the spans: the same invariants, and every packed span lies
            // inside a grown one.
            let mut grown = packed.clone();
            let inputs = FitInputs { hits: &hits, analyses: &analyses, budget, tokenizer: tokenizer(), contexts: &contexts };
            expand(&mut grown, &inputs);
            check_spans(&grown, &retrieved, budget, &selection, order, &contexts)?;
            prop_assert!(grown.len() <= packed.len());
            for p in &packed {
                let kept = grown.iter().any(|g| g.hit_index == p.hit_index && g.start <= p.start && p.end <= g.end);
                prop_assert!(kept, "{p:?} lost by the expansion: {grown:?}");
            }
            // Greedy: if nothing was packed, no single candidate would have fitted on its own.
            if packed.is_empty() {
                let above_floor = |c: &&Candidate| selection.min_score.is_none_or(|floor| c.score >= floor.0);
                for c in candidates.iter().filter(above_floor) {
                    let (text, analysis) = (&hits[c.hit_index as usize].text, &analyses[c.hit_index as usize]);
                    let own = contexts.count(tokenizer(), c.hit_index, text, analysis, c.header, (c.start, c.end));
                    let fragment = super::is_fragment(c, text, least as u32);
                    prop_assert!(own > budget as usize || c.token_count == 0 || fragment, "{c:?} ({own} tokens) fits {budget}");
                }
            }
        }
    }
}
