//! The contract of [`chunk_section`](super::chunk_section) as a checker, shared by the unit,
//! property, snapshot and fuzz tests (and usable in the server's debug builds).

use unicode_segmentation::UnicodeSegmentation;

use super::{ChunkOptions, ChunkSpan, Strategy, Unit};
use crate::tokens::TokenOffsets;

/// Checks `spans` (the output of `chunk_section(text, tokens, options, ..)`) against every
/// guarantee listed in the module doc; the error names the first one broken.
pub fn check_invariants(
    text: &str,
    tokens: &TokenOffsets,
    options: &ChunkOptions,
    spans: &[ChunkSpan],
) -> Result<(), String> {
    let max_size = options.max_size.max(1) as usize;
    let overlap = options.overlap.min(max_size as u32 - 1) as usize;
    let measure = Measure {
        text,
        tokens,
        fixed_unit: (options.strategy == Strategy::Fixed).then_some(options.unit),
    };
    for (index, span) in spans.iter().enumerate() {
        check_span(index, span, &measure, max_size)?;
        check_strategy(index, span, options.strategy)?;
        if index > 0 {
            check_neighbours(index, &spans[index - 1], span, &measure, overlap)?;
        }
    }
    check_coverage(text, spans)
}

/// The size of a piece in the unit `max_size` counts: words or chars for `Fixed` when asked,
/// else tokens.
struct Measure<'a> {
    text: &'a str,
    tokens: &'a TokenOffsets,
    fixed_unit: Option<Unit>,
}

impl Measure<'_> {
    fn size(&self, start: usize, end: usize) -> usize {
        match self.fixed_unit {
            Some(Unit::Words) => self.text[start..end].unicode_words().count(),
            Some(Unit::Chars) => self.text[start..end].chars().count(),
            _ => self.tokens.count_within(start..end),
        }
    }
}

/// One chunk alone: its range, boundaries, trimming, token count, size and table header.
fn check_span(
    index: usize,
    span: &ChunkSpan,
    measure: &Measure,
    max_size: usize,
) -> Result<(), String> {
    let (text, tokens) = (measure.text, measure.tokens);
    let (start, end) = (span.start as usize, span.end as usize);
    if start >= end || end > text.len() {
        return Err(format!(
            "chunk {index}: bad range {start}..{end} (len {})",
            text.len()
        ));
    }
    if !text.is_char_boundary(start) || !text.is_char_boundary(end) {
        return Err(format!(
            "chunk {index}: {start}..{end} not on char boundaries"
        ));
    }
    let piece = &text[start..end];
    if piece.trim().len() != piece.len() {
        return Err(format!("chunk {index}: not trimmed: {piece:?}"));
    }
    if span.token_count as usize != tokens.count_within(start..end) {
        return Err(format!(
            "chunk {index}: token_count {} is wrong",
            span.token_count
        ));
    }
    let size = measure.size(start, end);
    let single_char = piece.chars().nth(1).is_none();
    if size > max_size && !single_char {
        return Err(format!(
            "chunk {index}: size {size} > max {max_size}: {piece:?}"
        ));
    }
    if let Some((header_start, header_end)) = span.header {
        let header_tokens = tokens.count_within(header_start as usize..header_end as usize);
        if header_start > header_end
            || header_end as usize > text.len()
            || span.token_count as usize + header_tokens > max_size
        {
            return Err(format!(
                "chunk {index}: header {header_start}..{header_end} breaks the budget"
            ));
        }
    }
    Ok(())
}

/// The strategy a chunk reports: the requested one, or one `Auto` (and `Semantic`, `Csv` when
/// they fall back) may route to.
fn check_strategy(index: usize, span: &ChunkSpan, requested: Strategy) -> Result<(), String> {
    let routed = matches!(
        span.strategy,
        Strategy::Csv | Strategy::Code | Strategy::Structure | Strategy::Sentence
    );
    let expected = match requested {
        Strategy::Auto => routed,
        Strategy::Semantic | Strategy::Csv => {
            span.strategy == requested || span.strategy == Strategy::Sentence
        }
        requested => span.strategy == requested,
    };
    if !expected {
        return Err(format!(
            "chunk {index}: strategy {:?} for {:?}",
            span.strategy, requested
        ));
    }
    Ok(())
}

/// Two neighbours: in order, and sharing at most `overlap` (in the measured unit).
fn check_neighbours(
    index: usize,
    previous: &ChunkSpan,
    span: &ChunkSpan,
    measure: &Measure,
    overlap: usize,
) -> Result<(), String> {
    if previous.start >= span.start || previous.end >= span.end {
        return Err(format!("chunk {index}: out of order after {previous:?}"));
    }
    if span.start < previous.end {
        let shared = measure.size(span.start as usize, previous.end as usize);
        if shared > overlap {
            return Err(format!("chunk {index}: overlap {shared} > {overlap}"));
        }
    }
    Ok(())
}

/// Every non-whitespace char lies in some chunk. Starts and ends both increase (checked before),
/// so one sweep finds the chunk reaching furthest.
fn check_coverage(text: &str, spans: &[ChunkSpan]) -> Result<(), String> {
    let mut next_span = 0;
    let mut covered_to = 0usize;
    for (position, c) in text.char_indices() {
        while next_span < spans.len() && spans[next_span].start as usize <= position {
            covered_to = covered_to.max(spans[next_span].end as usize);
            next_span += 1;
        }
        if !c.is_whitespace() && position >= covered_to {
            return Err(format!("char {c:?} at byte {position} lies in no chunk"));
        }
    }
    Ok(())
}
