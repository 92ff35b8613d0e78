//! The expand stage: budget the pack stage could not spend grows the packed spans with their
//! neighbouring sentences, within their section, so a long budget reads as fewer, longer passages.
//!
//! When is a neighbour worth more than the next chunk on the list? The pack stage has already
//! taken every chunk of the list that fits, best first, so what is left over is budget that no
//! remaining chunk fits in: growing a span never displaces a chunk. Among the possible growths, a
//! span's next sentence on one side is worth the span's score times [`EXPANSION_DECAY`] to the
//! power of the sentences it has already grown on that side plus one (its text is the more
//! relevant the closer it lies to what matched): the best-valued growth that still fits is made
//! first, and a side stops growing when its next sentence does not fit. A growth that reaches
//! another span of its section merges with it. Every span is counted exactly with the budget
//! tokenizer on its own text (with its context: [`SpanContexts`]), so the budget is never exceeded.

use super::spans::overlaps_or_touches;
use super::{FitInputs, PackedSpan};

/// A neighbouring sentence k steps away from a span is worth the span's score × 0.5^k.
pub const EXPANSION_DECAY: f32 = 0.5;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Before,
    After,
}

/// A span's growth so far: sentences grown on each side, and the sides that cannot grow.
#[derive(Clone, Copy, Default)]
struct Growth {
    before: u32,
    after: u32,
    before_done: bool,
    after_done: bool,
}

/// Grows `spans` into the budget left over (see the module doc); spans stay disjoint and exact.
#[tracing::instrument(level = "debug", skip_all, fields(spans = spans.len()))]
pub fn expand(spans: &mut Vec<PackedSpan>, inputs: &FitInputs) {
    let budget = inputs.budget as u64;
    let mut used: u64 = spans.iter().map(|s| s.token_count as u64).sum();
    let mut growth = vec![Growth::default(); spans.len()];
    while used < budget {
        let Some((index, side)) = best_growth(spans, &growth) else {
            return;
        };
        match grow(spans, index, side, inputs) {
            Some((grown, absorbed)) if fits(used, spans, index, &absorbed, &grown, budget) => {
                used = used + grown.token_count as u64
                    - spans[index].token_count as u64
                    - absorbed
                        .iter()
                        .map(|&i| spans[i].token_count as u64)
                        .sum::<u64>();
                spans[index] = grown;
                match side {
                    Side::Before => growth[index].before += 1,
                    Side::After => growth[index].after += 1,
                }
                remove_absorbed(spans, &mut growth, absorbed);
            }
            _ => match side {
                Side::Before => growth[index].before_done = true,
                Side::After => growth[index].after_done = true,
            },
        }
    }
}

fn fits(
    used: u64,
    spans: &[PackedSpan],
    index: usize,
    absorbed: &[usize],
    grown: &PackedSpan,
    budget: u64,
) -> bool {
    let freed = spans[index].token_count as u64
        + absorbed
            .iter()
            .map(|&i| spans[i].token_count as u64)
            .sum::<u64>();
    used - freed + grown.token_count as u64 <= budget
}

/// The growth of highest value still open: (span, side).
fn best_growth(spans: &[PackedSpan], growth: &[Growth]) -> Option<(usize, Side)> {
    let mut best: Option<(usize, Side, f32)> = None;
    for (i, (span, g)) in spans.iter().zip(growth).enumerate() {
        for (side, steps, done) in [
            (Side::Before, g.before, g.before_done),
            (Side::After, g.after, g.after_done),
        ] {
            if done {
                continue;
            }
            let value = span.score * EXPANSION_DECAY.powi(steps as i32 + 1);
            if best.is_none_or(|(_, _, v)| value > v) {
                best = Some((i, side, value));
            }
        }
    }
    best.map(|(i, side, _)| (i, side))
}

/// The span at `index` grown by one sentence on `side`, merged with the spans of its section it
/// then overlaps or touches (their indices), counted exactly; none when the section has no
/// further sentence on that side.
fn grow(
    spans: &[PackedSpan],
    index: usize,
    side: Side,
    inputs: &FitInputs,
) -> Option<(PackedSpan, Vec<usize>)> {
    let span = spans[index];
    let hit = &inputs.hits[span.hit_index as usize];
    let sentences = &inputs.analyses[span.hit_index as usize].sentences;
    let (mut start, mut end) = (span.start, span.end);
    match side {
        Side::After => end = sentences.iter().find(|s| s.end > span.end)?.end,
        Side::Before => start = sentences.iter().rev().find(|s| s.start < span.start)?.start,
    }
    let mut header = (span.start, span.header);
    let mut absorbed = Vec::new();
    let mut best = span;
    loop {
        let before = absorbed.len();
        for (i, other) in spans.iter().enumerate() {
            if i == index
                || other.hit_index != span.hit_index
                || absorbed.contains(&i)
                || !overlaps_or_touches(&hit.text, (other.start, other.end), (start, end))
            {
                continue;
            }
            absorbed.push(i);
            (start, end) = (start.min(other.start), end.max(other.end));
            if other.start < header.0 {
                header = (other.start, other.header);
            }
            if other.score > best.score {
                best = *other;
            }
        }
        // The span continues a table only while the table's header lies wholly before it; a
        // span grown into the header takes the rest of it too (and may then touch another span).
        let mut widened = false;
        if let Some((header_start, header_end)) = header.1 {
            if start < header_end {
                widened = header_start < start;
                start = start.min(header_start);
                header.1 = None;
            }
        }
        if absorbed.len() == before && !widened {
            break;
        }
    }
    let header = header.1;
    let token_count = inputs.contexts.count(
        inputs.tokenizer,
        span.hit_index,
        &hit.text,
        &inputs.analyses[span.hit_index as usize],
        header,
        (start, end),
    ) as u32;
    let grown = PackedSpan {
        start,
        end,
        token_count,
        header,
        score: best.score,
        parts: best.parts,
        strategy: best.strategy,
        ..span
    };
    Some((grown, absorbed))
}

/// Drops the merged spans (and their growth records), keeping the others in order.
fn remove_absorbed(
    spans: &mut Vec<PackedSpan>,
    growth: &mut Vec<Growth>,
    mut absorbed: Vec<usize>,
) {
    absorbed.sort_unstable_by(|a, b| b.cmp(a));
    for i in absorbed {
        spans.remove(i);
        growth.remove(i);
    }
}
