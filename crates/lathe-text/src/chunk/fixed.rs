//! `Fixed`: windows of N tokens, UAX #29 words or chars, stepping by N - overlap.

use unicode_segmentation::UnicodeSegmentation;

use super::budget::Cutter;
use super::{ChunkSpan, Strategy, Unit};

pub(super) fn chunk(cutter: &Cutter, unit: Unit, overlap: usize, out: &mut Vec<ChunkSpan>) {
    match unit {
        Unit::Tokens => by_tokens(cutter, overlap, out),
        Unit::Words => by_boundaries(
            cutter,
            || cutter.text.unicode_word_indices().map(|(start, _)| start),
            overlap,
            out,
        ),
        Unit::Chars => by_boundaries(
            cutter,
            || cutter.text.char_indices().map(|(start, _)| start),
            overlap,
            out,
        ),
    }
}

fn push(cutter: &Cutter, out: &mut Vec<ChunkSpan>, start: usize, end: usize) {
    cutter.push(out, start, end, Strategy::Fixed, None, None);
}

/// Windows of `max_tokens` tokens: a chunk ends where its `max_tokens + 1`-th token starts, and the
/// next one starts at the token `max_tokens - overlap` after its first.
fn by_tokens(cutter: &Cutter, overlap: usize, out: &mut Vec<ChunkSpan>) {
    let text = cutter.text;
    let max_tokens = cutter.max_tokens;
    let step = max_tokens - overlap;
    let content_end = text.trim_end().len();
    let mut pos = text.len() - text.trim_start().len();
    while pos < content_end {
        let end = cutter.fit_end(pos, text.len(), max_tokens);
        push(cutter, out, pos, end);
        if end >= content_end {
            break;
        }
        let first = cutter
            .tokens
            .starts()
            .partition_point(|&s| (s as usize) < pos);
        let mut next = if first + step < cutter.tokens.len() {
            cutter.tokens.start(first + step)
        } else {
            end
        };
        if next <= pos || next > end || cutter.count(next, end) > overlap {
            next = end;
        }
        pos = next;
    }
}

/// Windows over unit starts (`boundaries()` iterates them, increasing): chunk k spans from unit k·step to the
/// start of unit k·step + max (or the text end); the first chunk starts at byte 0 so that text
/// before the first unit (punctuation, emoji) is covered.
fn by_boundaries<Boundaries: Iterator<Item = usize>>(
    cutter: &Cutter,
    boundaries: impl Fn() -> Boundaries,
    overlap: usize,
    out: &mut Vec<ChunkSpan>,
) {
    let text_len = cutter.text.len();
    let max_units = cutter.max_tokens;
    let step = max_units - overlap;
    let mut starts = boundaries();
    let mut ends = boundaries();
    // The start of unit `max_units`: the end of the first window.
    let mut end = ends.nth(max_units);
    let mut start = 0;
    starts.next();
    loop {
        let end_byte = end.unwrap_or(text_len);
        push(cutter, out, start, end_byte);
        if end.is_none() {
            return;
        }
        // Advance both windows by `step` units.
        match starts.nth(step - 1) {
            Some(next_start) => start = next_start,
            None => return,
        }
        end = ends.nth(step - 1);
    }
}
