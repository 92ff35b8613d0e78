//! Cutting primitives shared by the strategies: token-bounded cuts and packing of units.
//!
//! Sizes are always measured with `TokenOffsets::count_within` over the exact candidate range,
//! never by adding up the counts of pieces: a token that straddles a piece boundary belongs to
//! neither piece but does belong to their union.

use std::ops::Range;

use super::{ChunkSpan, Strategy};

/// How far a cut may move back to reach a word start.
const WORD_BACK_OFF_TOKENS: usize = 16;
use crate::tokens::TokenOffsets;

pub(super) struct Cutter<'a> {
    pub text: &'a str,
    pub tokens: &'a TokenOffsets,
    /// `max_size` in tokens, at least 1.
    pub max_tokens: usize,
    /// The text's sentences when the caller already has them (exactly what
    /// [`super::sentences`] gives for the whole text), so they are not segmented again.
    pub sentences: Option<&'a [std::ops::Range<u32>]>,
}

impl Cutter<'_> {
    /// Tokens wholly inside `start..end`.
    #[inline]
    pub fn count(&self, start: usize, end: usize) -> usize {
        self.tokens.count_within(start..end)
    }

    /// `start..end` without surrounding whitespace, or `None` when nothing else is left.
    #[inline]
    pub fn trimmed(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let piece = &self.text[start..end];
        let leading = piece.len() - piece.trim_start().len();
        let rest = &piece[leading..];
        if rest.is_empty() {
            return None;
        }
        let kept = rest.trim_end().len();
        Some((start + leading, start + leading + kept))
    }

    /// Appends the trimmed span `start..end` to `out` (nothing when it is only whitespace).
    pub fn push(
        &self,
        out: &mut Vec<ChunkSpan>,
        start: usize,
        end: usize,
        strategy: Strategy,
        header: Option<(u32, u32)>,
        heading: Option<(u32, u32)>,
    ) {
        let Some((start, end)) = self.trimmed(start, end) else {
            return;
        };
        // Overlapping windows that begin or end in whitespace can trim to a span that holds, or
        // is held by, the previous chunk: keep only the larger so that starts and ends both
        // strictly increase (the overlap with the chunk before can then only shrink).
        if let Some(last) = out.last() {
            if start >= last.start as usize && end <= last.end as usize {
                return;
            }
        }
        while let Some(last) = out.last() {
            if start > last.start as usize || end < last.end as usize {
                break;
            }
            out.pop();
        }
        debug_assert!(out
            .last()
            .is_none_or(|last| (last.start as usize) < start && (last.end as usize) < end));
        out.push(ChunkSpan {
            start: start as u32,
            end: end as u32,
            token_count: self.count(start, end) as u32,
            strategy,
            header,
            heading,
        });
    }

    /// The furthest cut in `pos + 1 char ..= limit` such that `pos..cut` holds at most `budget`
    /// tokens. Cuts fall on token starts (or `limit`). Always advances by at least one char, which
    /// is the only case where the result may exceed `budget`: one char holding more tokens.
    pub fn fit_end(&self, pos: usize, limit: usize, budget: usize) -> usize {
        debug_assert!(pos < limit);
        let budget = budget.max(1);
        if self.count(pos, limit) <= budget {
            return limit;
        }
        let first = self
            .tokens
            .starts()
            .partition_point(|&s| (s as usize) < pos);
        // More than `budget` tokens start at or after `pos`, so `first + budget` exists.
        let mut cut = self.tokens.start(first + budget).min(limit);
        // Zero-width or overlapping spans (never from a real tokenizer) can still overcount.
        while cut > pos && self.count(pos, cut) > budget {
            cut = floor_boundary(self.text, cut - 1);
        }
        if cut <= pos {
            cut = next_boundary(self.text, pos).min(limit);
        }
        cut
    }

    /// Moves a token-start cut back to the start of its word when the token continues a word
    /// (a WordPiece `##` piece: glued to the previous token, letters on both sides), looking back
    /// at most [`WORD_BACK_OFF_TOKENS`] tokens and never to `pos`. Re-tokenizing a chunk that
    /// starts mid-word gives more tokens than its count in the section; cutting at word starts
    /// avoids that wherever a word is shorter than the budget.
    fn back_off_to_word_start(&self, pos: usize, cut: usize) -> usize {
        let starts = self.tokens.starts();
        let index = starts.partition_point(|&s| (s as usize) < cut);
        if index >= starts.len() || starts[index] as usize != cut {
            return cut;
        }
        let mut candidate = index;
        for _ in 0..WORD_BACK_OFF_TOKENS {
            if candidate == 0 || (starts[candidate] as usize) <= pos {
                return cut;
            }
            if !self.continues_word(candidate) {
                return starts[candidate] as usize;
            }
            candidate -= 1;
        }
        cut
    }

    /// Whether a token starts at `pos` and continues a word (see [`Self::continues_word`]).
    pub fn starts_mid_word(&self, pos: usize) -> bool {
        let starts = self.tokens.starts();
        let index = starts.partition_point(|&s| (s as usize) < pos);
        index < starts.len() && starts[index] as usize == pos && self.continues_word(index)
    }

    /// Whether token `index` is glued to the previous token inside a word.
    fn continues_word(&self, index: usize) -> bool {
        let start = self.tokens.start(index);
        if index == 0 || self.tokens.end(index - 1) != start {
            return false;
        }
        let before = self.text[..start].chars().next_back();
        let after = self.text[start..].chars().next();
        matches!((before, after), (Some(b), Some(a)) if b.is_alphanumeric() && a.is_alphanumeric())
    }

    /// Calls `emit` with consecutive trimmed pieces of `start..end`, each of at most `budget`
    /// tokens, cut at token starts.
    pub fn split_tokens(
        &self,
        start: usize,
        end: usize,
        budget: usize,
        mut emit: impl FnMut(usize, usize),
    ) {
        let mut pos = start;
        while pos < end {
            let rest = &self.text[pos..end];
            let skipped = rest.len() - rest.trim_start().len();
            pos += skipped;
            if pos >= end {
                break;
            }
            let cut = self.back_off_to_word_start(pos, self.fit_end(pos, end, budget));
            if let Some((a, b)) = self.trimmed(pos, cut) {
                emit(a, b);
            }
            pos = cut;
        }
    }

    /// Pushes `start..end` to `units` if it fits `budget`, else its token-bounded pieces.
    pub fn push_unit_or_split(
        &self,
        start: usize,
        end: usize,
        budget: usize,
        units: &mut Vec<Range<u32>>,
    ) {
        let Some((start, end)) = self.trimmed(start, end) else {
            return;
        };
        if self.count(start, end) <= budget {
            units.push(start as u32..end as u32);
            return;
        }
        self.split_tokens(start, end, budget, |a, b| units.push(a as u32..b as u32));
    }

    /// Packs consecutive units (trimmed, non-empty, in order, each within `budget` unless it is a
    /// single char) greedily into chunks of at most `budget` tokens. Each next chunk starts with
    /// as many trailing units of the previous one as hold at most `overlap` tokens and still leave
    /// room for the next new unit.
    pub fn pack(
        &self,
        units: &[Range<u32>],
        budget: usize,
        overlap: usize,
        mut emit: impl FnMut(usize, usize),
    ) {
        let unit_count = units.len();
        let mut first = 0;
        while first < unit_count {
            let start = units[first].start as usize;
            let mut last = first;
            while last + 1 < unit_count && self.count(start, units[last + 1].end as usize) <= budget
            {
                last += 1;
            }
            let end = units[last].end as usize;
            emit(start, end);
            if last + 1 >= unit_count {
                break;
            }
            let next_end = units[last + 1].end as usize;
            let mut next_first = last + 1;
            while overlap > 0 && next_first - 1 > first {
                let candidate = units[next_first - 1].start as usize;
                if self.count(candidate, end) > overlap || self.count(candidate, next_end) > budget
                {
                    break;
                }
                next_first -= 1;
            }
            first = next_first;
        }
    }

    /// Packs rows without overlap: the first chunk may use `first_budget`, later ones
    /// `rest_budget` (room left for a repeated header). `emit(start, end, is_first)`.
    pub fn pack_rows(
        &self,
        rows: &[Range<u32>],
        first_budget: usize,
        rest_budget: usize,
        mut emit: impl FnMut(usize, usize, bool),
    ) {
        let mut first = 0;
        let mut is_first_chunk = true;
        while first < rows.len() {
            let budget = if is_first_chunk {
                first_budget
            } else {
                rest_budget
            };
            let start = rows[first].start as usize;
            let mut last = first;
            while last + 1 < rows.len() && self.count(start, rows[last + 1].end as usize) <= budget
            {
                last += 1;
            }
            emit(start, rows[last].end as usize, is_first_chunk);
            is_first_chunk = false;
            first = last + 1;
        }
    }

    /// Lines of `start..end` (trimmed, non-empty) as units, each split to at most `budget` tokens.
    pub fn line_units(&self, start: usize, end: usize, budget: usize, units: &mut Vec<Range<u32>>) {
        let mut line_start = start;
        for (offset, _) in self.text[start..end].match_indices('\n') {
            let line_end = start + offset;
            self.push_unit_or_split(line_start, line_end, budget, units);
            line_start = line_end + 1;
        }
        if line_start < end {
            self.push_unit_or_split(line_start, end, budget, units);
        }
    }
}

/// The largest char boundary `<= index`.
pub(super) fn floor_boundary(text: &str, index: usize) -> usize {
    crate::tokens::floor_char_boundary(text, index)
}

/// The smallest char boundary `> index` (or the text length).
pub(super) fn next_boundary(text: &str, index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    crate::tokens::ceil_char_boundary(text, index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_end_cuts_at_the_token_after_the_budget() {
        let text = "aa bb cc dd";
        let tokens = TokenOffsets::whitespace(text);
        let cutter = Cutter {
            text,
            tokens: &tokens,
            max_tokens: 2,
            sentences: None,
        };
        assert_eq!(cutter.fit_end(0, text.len(), 2), 6);
        assert_eq!(cutter.fit_end(6, text.len(), 2), text.len());
    }

    #[test]
    fn fit_end_gives_one_char_when_a_char_holds_too_many_tokens() {
        let text = "a😀b";
        let tokens = TokenOffsets::from_spans(text, [(0, 1), (1, 3), (3, 5), (5, 6)]);
        let cutter = Cutter {
            text,
            tokens: &tokens,
            max_tokens: 1,
            sentences: None,
        };
        assert_eq!(cutter.fit_end(0, text.len(), 1), 1);
        assert_eq!(cutter.fit_end(1, text.len(), 1), 5);
    }

    #[test]
    fn pack_overlaps_whole_units_within_the_overlap() {
        let text = "a b c d e f";
        let tokens = TokenOffsets::whitespace(text);
        let cutter = Cutter {
            text,
            tokens: &tokens,
            max_tokens: 3,
            sentences: None,
        };
        let units: Vec<Range<u32>> = (0..6).map(|i| i * 2..i * 2 + 1).collect();
        let mut chunks = Vec::new();
        cutter.pack(&units, 3, 1, |a, b| chunks.push(&text[a..b]));
        assert_eq!(chunks, ["a b c", "c d e", "e f"]);
    }
}
