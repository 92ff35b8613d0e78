//! Stage 5: pack the best chunks into the caller's token budget.
//!
//! Greedy by score: a chunk is taken while the total still fits, merged with the chunks of its
//! section that it overlaps or touches (so no text is returned twice); chunks that do not fit are
//! skipped and smaller ones after them may still be taken. Sizes come from the sections' token
//! offsets; the final spans are then recounted exactly with the budget tokenizer and, should a
//! recount exceed the budget, the weakest spans are dropped. The budget is never exceeded.

use std::sync::Arc;

use super::Candidate;
use crate::cache::SectionAnalysis;
use crate::chunk::Strategy;
use crate::index::SectionHit;
use crate::tokenizer::BudgetTokenizer;
use crate::types::ScoreParts;

/// A merged span of one section, ready to be returned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PackedSpan {
    pub section: u32,
    /// Byte range in the section text.
    pub start: u32,
    pub end: u32,
    /// Exact count in the budget tokenizer (after `verify`), an estimate before.
    pub token_count: u32,
    pub score: f32,
    pub parts: ScoreParts,
    pub strategy: Strategy,
}

/// `candidates` must be sorted best first.
pub fn pack(
    candidates: &[Candidate],
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    budget: u32,
    tokenizer: &BudgetTokenizer,
) -> Vec<PackedSpan> {
    let mut spans = select(candidates, hits, analyses, budget);
    verify(&mut spans, hits, budget, tokenizer);
    spans
}

/// Greedy selection on estimated sizes.
pub fn select(
    candidates: &[Candidate],
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    budget: u32,
) -> Vec<PackedSpan> {
    let budget = budget as u64;
    let mut spans: Vec<PackedSpan> = Vec::new();
    let mut used: u64 = 0;
    let mut absorbed: Vec<usize> = Vec::new();
    for candidate in candidates {
        if candidate.token_count == 0 || candidate.start >= candidate.end {
            continue;
        }
        let text = &hits[candidate.section as usize].text;
        let (mut start, mut end) = (candidate.start, candidate.end);
        absorbed.clear();
        let mut contained = false;
        for (i, span) in spans.iter().enumerate() {
            if span.section != candidate.section
                || !overlaps_or_touches(text, (span.start, span.end), (start, end))
            {
                continue;
            }
            if span.start <= candidate.start && candidate.end <= span.end {
                contained = true;
                break;
            }
            absorbed.push(i);
        }
        if contained {
            continue;
        }
        // Merging can chain: a widened span may now touch another one of the section.
        loop {
            for &i in &absorbed {
                start = start.min(spans[i].start);
                end = end.max(spans[i].end);
            }
            let before = absorbed.len();
            for (i, span) in spans.iter().enumerate() {
                if span.section == candidate.section
                    && !absorbed.contains(&i)
                    && overlaps_or_touches(text, (span.start, span.end), (start, end))
                {
                    absorbed.push(i);
                }
            }
            if absorbed.len() == before {
                break;
            }
        }
        let tokens = &analyses[candidate.section as usize].tokens;
        let merged_tokens = tokens.count_within(start as usize..end as usize) as u64;
        let freed: u64 = absorbed.iter().map(|&i| spans[i].token_count as u64).sum();
        if used - freed + merged_tokens > budget {
            continue;
        }
        let mut merged = PackedSpan {
            section: candidate.section,
            start,
            end,
            token_count: merged_tokens as u32,
            score: candidate.score,
            parts: candidate.parts,
            strategy: candidate.strategy,
        };
        for &i in &absorbed {
            if spans[i].score > merged.score {
                merged.score = spans[i].score;
                merged.parts = spans[i].parts;
                merged.strategy = spans[i].strategy;
            }
        }
        used = used - freed + merged_tokens;
        absorbed.sort_unstable_by(|a, b| b.cmp(a));
        for &i in &absorbed {
            spans.swap_remove(i);
        }
        spans.push(merged);
    }
    spans.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.section.cmp(&b.section))
            .then(a.start.cmp(&b.start))
    });
    spans
}

/// Recounts each span exactly and drops the weakest until the total fits.
pub fn verify(
    spans: &mut Vec<PackedSpan>,
    hits: &[SectionHit],
    budget: u32,
    tokenizer: &BudgetTokenizer,
) {
    for span in spans.iter_mut() {
        let text = &hits[span.section as usize].text[span.start as usize..span.end as usize];
        span.token_count = tokenizer.count(text) as u32;
    }
    // `spans` is sorted best first: drop from the end.
    while spans.iter().map(|s| s.token_count as u64).sum::<u64>() > budget as u64 {
        spans.pop();
    }
}

/// True when two byte ranges of `text` overlap or only whitespace lies between them.
fn overlaps_or_touches(text: &str, a: (u32, u32), b: (u32, u32)) -> bool {
    let (first, second) = if a.0 <= b.0 { (a, b) } else { (b, a) };
    if second.0 <= first.1 {
        return true;
    }
    text.get(first.1 as usize..second.0 as usize)
        .is_some_and(|gap| gap.chars().all(char::is_whitespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_means_only_whitespace_between() {
        let text = "one two  three";
        assert!(overlaps_or_touches(text, (0, 3), (4, 7)));
        assert!(overlaps_or_touches(text, (4, 7), (0, 3)));
        assert!(overlaps_or_touches(text, (0, 5), (4, 7)));
        assert!(!overlaps_or_touches(text, (0, 3), (9, 14)));
    }
}
