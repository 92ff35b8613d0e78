//! Fitting raw sections to the section token limit.
//!
//! A raw section is trimmed and counted once; if it fits it is kept whole. Otherwise it is cut at
//! the coarsest level that has more than one piece (paragraphs, then UAX#29 sentences, then
//! whitespace-separated words), each piece counted once, and the pieces grouped greedily in order while the sum of
//! their counts fits. A group of several pieces is verified by counting its own text (tokenizers
//! do not add up exactly, and a char counter also counts the whitespace between pieces); if the
//! sum was wrong, a binary search over the group's pieces finds the longest prefix that truly
//! fits. A single piece that alone is too big goes down one level.
//!
//! Below words, a piece is cut at grapheme boundaries by an exponential-then-binary search on the
//! counted prefix length, and a single grapheme that is still too big is cut the same way at char
//! boundaries. A single char that alone counts more than the limit is kept as its own section:
//! it cannot be cut, and dropping it would lose text.
//!
//! Only verified counts decide what is emitted, so no section exceeds the limit whatever
//! `count_tokens` does (even if it is not monotone), except that single char.
//!
//! With a whitespace-local counter (the default budget tokenizer, see
//! [`TokenCounter::local_spans`]) a raw section is tokenized once and the count of every range
//! inside it whose ends touch whitespace is derived from those spans, exactly as counting it would
//! give; other ranges (cuts inside a word or between sentences without a space) are counted.

use std::ops::Range;

use unicode_segmentation::UnicodeSegmentation;

use crate::tokens::sentence_bound_indices;

use super::plain::{paragraph_ranges, push_trimmed, trimmed, whitespace_separated_ranges};
use super::{RawSection, SectionSpan, TokenCounter};

/// Trims, drops empty and cuts oversized raw sections; returns the final sections in order.
pub(super) fn fit_sections<C: TokenCounter + ?Sized>(
    text: &str,
    raw_sections: Vec<RawSection>,
    section_tokens: usize,
    count_tokens: &C,
) -> Vec<SectionSpan> {
    let mut fitter = Fitter {
        text,
        section_tokens,
        count_tokens,
        sections: Vec::with_capacity(raw_sections.len()),
        spans: None,
    };
    for raw_section in raw_sections {
        fitter.push_section(raw_section.range, &raw_section.heading_path);
    }
    fitter.sections
}

/// The levels an oversized range is cut at, coarsest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Paragraph,
    Sentence,
    Word,
    Grapheme,
    Char,
}

struct Fitter<'t, 'c, C: TokenCounter + ?Sized> {
    text: &'t str,
    section_tokens: usize,
    count_tokens: &'c C,
    sections: Vec<SectionSpan>,
    /// The raw section being fitted and the counter's local spans of it (absolute byte offsets),
    /// when the counter gives them.
    spans: Option<SectionSpans>,
}

/// A raw section's range and its counter's local token spans (absolute byte offsets).
type SectionSpans = (Range<usize>, Vec<(u32, u32)>);

impl<C: TokenCounter + ?Sized> Fitter<'_, '_, C> {
    /// The count of `range`, or, when the counter knows without counting that it holds more than
    /// the limit, that lower bound (a 10 MB word is not counted to learn that it is too big).
    fn count(&self, range: Range<usize>) -> usize {
        if let Some(count) = self.derived_count(range.clone()) {
            return count;
        }
        let text = &self.text[range];
        let least = self.count_tokens.least_tokens(text);
        if least > self.section_tokens {
            return least;
        }
        self.count_tokens.count(text)
    }

    /// The count of `range` from the raw section's local spans, when it lies inside that section
    /// and both its ends touch whitespace or the section's ends: what counting it would give.
    fn derived_count(&self, range: Range<usize>) -> Option<usize> {
        let (section, spans) = self.spans.as_ref()?;
        if range.start < section.start || range.end > section.end || range.start > range.end {
            return None;
        }
        let touches_whitespace = |position: usize| {
            position == section.start
                || position == section.end
                || self.text[..position]
                    .chars()
                    .next_back()
                    .is_some_and(char::is_whitespace)
                || self.text[position..]
                    .chars()
                    .next()
                    .is_some_and(char::is_whitespace)
        };
        if !touches_whitespace(range.start) || !touches_whitespace(range.end) {
            return None;
        }
        let first = spans.partition_point(|&(start, _)| (start as usize) < range.start);
        let last =
            first + spans[first..].partition_point(|&(start, _)| (start as usize) < range.end);
        // A span across either end (never from a whitespace-local counter): count instead.
        let crosses_start = first > 0 && spans[first - 1].1 as usize > range.start;
        let crosses_end = spans[first..last]
            .iter()
            .any(|&(_, end)| end as usize > range.end);
        if crosses_start || crosses_end {
            return None;
        }
        let mut bounder = crate::tokens::SpanBounder::new(&self.text[range.clone()]);
        let mut count = 0usize;
        let mut tally = |_: usize, _: usize| count += 1;
        for &(start, end) in &spans[first..last] {
            bounder.push(
                start as usize - range.start,
                end as usize - range.start,
                &mut tally,
            );
        }
        bounder.finish(&mut tally);
        Some(count)
    }

    fn fits(&self, range: Range<usize>) -> bool {
        self.count(range) <= self.section_tokens
    }

    fn emit(&mut self, range: Range<usize>, heading_path: &[String]) {
        debug_assert!(trimmed(self.text, range.clone()) == Some(range.clone()));
        debug_assert!(self
            .sections
            .last()
            .is_none_or(|last| last.end <= range.start));
        self.sections.push(SectionSpan {
            start: range.start,
            end: range.end,
            heading_path: heading_path.to_vec(),
        });
    }

    fn push_section(&mut self, range: Range<usize>, heading_path: &[String]) {
        let Some(range) = trimmed(self.text, range) else {
            return;
        };
        self.spans = self
            .count_tokens
            .local_spans(&self.text[range.clone()])
            .map(|spans| {
                let offset = range.start as u32;
                let absolute = spans
                    .into_iter()
                    .map(|(start, end)| (start + offset, end + offset))
                    .collect();
                (range.clone(), absolute)
            });
        if self.fits(range.clone()) {
            self.emit(range, heading_path);
            return;
        }
        self.split(range, Level::Paragraph, heading_path);
    }

    /// Cuts `range` (trimmed, known not to fit) at `level` or finer.
    fn split(&mut self, range: Range<usize>, level: Level, heading_path: &[String]) {
        let mut pieces = Vec::new();
        let next_level = match level {
            Level::Paragraph => {
                paragraph_ranges(self.text, range.clone(), &mut pieces);
                Level::Sentence
            }
            Level::Sentence => {
                for (offset, sentence) in sentence_bound_indices(&self.text[range.clone()]) {
                    let start = range.start + offset;
                    push_trimmed(self.text, start..start + sentence.len(), &mut pieces);
                }
                Level::Word
            }
            Level::Word => {
                // Whitespace-separated words, not UAX#29 ones: those part "nine." into "nine" and
                // ".", whose counts add up to more than the whole for most counters.
                whitespace_separated_ranges(self.text, range.clone(), &mut pieces);
                Level::Grapheme
            }
            Level::Grapheme => {
                if self.cut_word_at_token_starts(range.clone(), heading_path) {
                    return;
                }
                let boundaries = self.text[range.clone()]
                    .grapheme_indices(true)
                    .map(|(offset, _)| range.start + offset)
                    .chain(std::iter::once(range.end));
                let boundaries: Vec<usize> = boundaries.collect();
                self.cut_by_search(&boundaries, Level::Grapheme, heading_path);
                return;
            }
            Level::Char => {
                let boundaries = self.text[range.clone()]
                    .char_indices()
                    .map(|(offset, _)| range.start + offset)
                    .chain(std::iter::once(range.end));
                let boundaries: Vec<usize> = boundaries.collect();
                self.cut_by_search(&boundaries, Level::Char, heading_path);
                return;
            }
        };
        if pieces.len() <= 1 {
            // The single piece is `range` itself (both trimmed), already known not to fit.
            self.split(range, next_level, heading_path);
            return;
        }
        self.group_greedily(&pieces, next_level, heading_path);
    }

    /// Groups consecutive `pieces` greedily by the sum of their counts, verifying each group.
    fn group_greedily(
        &mut self,
        pieces: &[Range<usize>],
        next_level: Level,
        heading_path: &[String],
    ) {
        let piece_tokens: Vec<usize> = pieces
            .iter()
            .map(|piece| self.count(piece.clone()))
            .collect();
        let mut first = 0;
        while first < pieces.len() {
            if piece_tokens[first] > self.section_tokens {
                self.split(pieces[first].clone(), next_level, heading_path);
                first += 1;
                continue;
            }
            let mut end = first + 1;
            let mut estimate = piece_tokens[first];
            while end < pieces.len() && estimate + piece_tokens[end] <= self.section_tokens {
                estimate += piece_tokens[end];
                end += 1;
            }
            let group = |end: usize| pieces[first].start..pieces[end - 1].end;
            if end > first + 1 && !self.fits(group(end)) {
                // The estimate was wrong: find the longest prefix that truly fits. `known_fit`
                // always holds a verified count (a single piece was counted exactly).
                let mut known_fit = first + 1;
                let mut known_over = end;
                while known_over - known_fit > 1 {
                    let middle = known_fit + (known_over - known_fit) / 2;
                    if self.fits(group(middle)) {
                        known_fit = middle;
                    } else {
                        known_over = middle;
                    }
                }
                end = known_fit;
            }
            self.emit(group(end), heading_path);
            first = end;
        }
    }

    /// Cuts `word` (a whitespace-free range known not to fit) at grapheme boundaries in one pass
    /// over its token offsets: each section ends where the `section_tokens + 1`-th token after its
    /// start begins (moved back to a grapheme boundary), or a sixteenth of the limit earlier when
    /// the piece's own count is over, or else at the longest prefix a binary search finds. False
    /// (nothing emitted) when the counter gives no offsets.
    fn cut_word_at_token_starts(&mut self, word: Range<usize>, heading_path: &[String]) -> bool {
        let Some(starts) = self.count_tokens.token_starts(&self.text[word.clone()]) else {
            return false;
        };
        let word_text = &self.text[word.clone()];
        let grapheme_floor = |position: usize| -> usize {
            let mut cursor =
                unicode_segmentation::GraphemeCursor::new(position - word.start, word.len(), true);
            match cursor.is_boundary(word_text, 0) {
                Ok(true) => position,
                _ => match cursor.prev_boundary(word_text, 0) {
                    Ok(Some(boundary)) => word.start + boundary,
                    _ => word.start,
                },
            }
        };
        let limit = self.section_tokens;
        let mut first = word.start;
        while first < word.end {
            let first_token =
                starts.partition_point(|&start| word.start + (start as usize) < first);
            let token_cut = |tokens: usize| -> usize {
                match starts.get(first_token + tokens) {
                    Some(&start) => grapheme_floor(word.start + start as usize),
                    None => word.end,
                }
            };
            let mut end = None;
            for tokens in [limit, limit - limit / 16 - usize::from(limit > 1)] {
                let cut = token_cut(tokens.max(1));
                if cut > first && self.fits(first..cut) {
                    end = Some(cut);
                    break;
                }
            }
            let end = match end {
                Some(end) => end,
                None => match self.longest_fitting_graphemes(first, token_cut(limit), word.end) {
                    Some(end) => end,
                    None => {
                        // Not even one grapheme fits: cut it at chars, or keep a lone char.
                        let unit_end = first
                            + self.text[first..word.end]
                                .graphemes(true)
                                .next()
                                .map_or(word.end - first, str::len);
                        let unit = first..unit_end;
                        if self.text[unit.clone()].chars().nth(1).is_some() {
                            self.split(unit, Level::Char, heading_path);
                        } else {
                            self.emit(unit, heading_path);
                        }
                        first = unit_end;
                        continue;
                    }
                },
            };
            self.emit(first..end, heading_path);
            first = end;
        }
        true
    }

    /// The furthest grapheme boundary `cut` in `first` + one grapheme `..= limit` such that
    /// `first..cut` fits, by binary search; `None` when one grapheme alone does not fit. `limit`
    /// is taken not to fit (it is only tested when it is one grapheme away); when it is not past
    /// `first`, the search runs to `word_end`.
    fn longest_fitting_graphemes(
        &self,
        first: usize,
        limit: usize,
        word_end: usize,
    ) -> Option<usize> {
        let limit = if limit > first { limit } else { word_end };
        let boundaries: Vec<usize> = self.text[first..limit]
            .grapheme_indices(true)
            .map(|(offset, _)| first + offset)
            .chain(std::iter::once(limit))
            .collect();
        if boundaries.len() < 2 || !self.fits(first..boundaries[1]) {
            return None;
        }
        let mut known_fit = 1;
        let mut known_over = boundaries.len() - 1;
        if known_over == known_fit {
            return Some(boundaries[known_fit]);
        }
        while known_over - known_fit > 1 {
            let middle = known_fit + (known_over - known_fit) / 2;
            if self.fits(first..boundaries[middle]) {
                known_fit = middle;
            } else {
                known_over = middle;
            }
        }
        Some(boundaries[known_fit])
    }

    /// Cuts the text between `boundaries[0]` and the last boundary into the longest prefixes that
    /// fit, each found by an exponential then binary search over the boundaries. A single unit
    /// (grapheme or char, by `level`) that does not fit goes down to chars, or, as a char, is
    /// emitted alone.
    fn cut_by_search(&mut self, boundaries: &[usize], level: Level, heading_path: &[String]) {
        let last = boundaries.len().saturating_sub(1);
        let mut first = 0;
        while first < last {
            let fits_up_to = |fitter: &Self, end: usize| match trimmed(
                fitter.text,
                boundaries[first]..boundaries[end],
            ) {
                Some(range) => fitter.fits(range),
                None => true,
            };
            if !fits_up_to(self, first + 1) {
                let unit = boundaries[first]..boundaries[first + 1];
                if let Some(unit) = trimmed(self.text, unit) {
                    let has_several_chars = self.text[unit.clone()].chars().nth(1).is_some();
                    if level == Level::Grapheme && has_several_chars {
                        self.split(unit, Level::Char, heading_path);
                    } else {
                        self.emit(unit, heading_path);
                    }
                }
                first += 1;
                continue;
            }
            let mut known_fit = first + 1;
            let mut known_over = None;
            let mut step = 1;
            while known_fit < last {
                let probe = (known_fit + step).min(last);
                if fits_up_to(self, probe) {
                    known_fit = probe;
                    step = step.saturating_mul(2);
                } else {
                    known_over = Some(probe);
                    break;
                }
            }
            if let Some(mut known_over) = known_over {
                while known_over - known_fit > 1 {
                    let middle = known_fit + (known_over - known_fit) / 2;
                    if fits_up_to(self, middle) {
                        known_fit = middle;
                    } else {
                        known_over = middle;
                    }
                }
            }
            if let Some(piece) = trimmed(self.text, boundaries[first]..boundaries[known_fit]) {
                self.emit(piece, heading_path);
            }
            first = known_fit;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn words(text: &str) -> usize {
        text.split_whitespace().count()
    }

    fn chars(text: &str) -> usize {
        text.chars().count()
    }

    fn fit_whole<'t>(text: &'t str, limit: usize, count: &dyn Fn(&str) -> usize) -> Vec<&'t str> {
        let raw = vec![RawSection {
            range: 0..text.len(),
            heading_path: vec!["H".to_string()],
        }];
        fit_sections(text, raw, limit, count)
            .into_iter()
            .map(|s| {
                assert_eq!(s.heading_path, ["H"]);
                &text[s.start..s.end]
            })
            .collect()
    }

    #[test]
    fn fitting_text_is_one_trimmed_section() {
        assert_eq!(fit_whole("  a b\n\nc  ", 10, &words), ["a b\n\nc"]);
        assert!(fit_whole(" \n\t ", 10, &words).is_empty());
    }

    #[test]
    fn oversized_text_is_grouped_by_paragraphs() {
        let text = "a b\n\nc d\n\ne f g\n\nh";
        assert_eq!(fit_whole(text, 4, &words), ["a b\n\nc d", "e f g\n\nh"]);
    }

    #[test]
    fn oversized_paragraph_is_cut_at_sentences_then_words() {
        let text = "One two three. Four five six seven eight nine.";
        assert_eq!(
            fit_whole(text, 3, &words),
            ["One two three.", "Four five six", "seven eight nine."]
        );
    }

    #[test]
    fn wrong_sum_estimate_is_verified_and_cut_back() {
        // The char counter counts the blank lines between paragraphs, which the per-paragraph sum
        // misses: "aaa\n\nbbb" is 8 chars, not 6.
        let text = "aaa\n\nbbb\n\nccc";
        assert_eq!(fit_whole(text, 7, &chars), ["aaa", "bbb", "ccc"]);
        assert_eq!(fit_whole(text, 8, &chars), ["aaa\n\nbbb", "ccc"]);
    }

    #[test]
    fn a_long_word_is_cut_at_graphemes_and_never_splits_one() {
        let text = "e\u{301}e\u{301}e\u{301}e\u{301}e\u{301}";
        let pieces = fit_whole(text, 4, &chars);
        assert_eq!(pieces, ["e\u{301}e\u{301}", "e\u{301}e\u{301}", "e\u{301}"]);
    }

    #[test]
    fn a_grapheme_over_the_limit_is_cut_at_chars_and_a_char_over_it_kept_alone() {
        assert_eq!(
            fit_whole("e\u{301}\u{302}", 2, &chars),
            ["e\u{301}", "\u{302}"]
        );
        let heavy = |s: &str| 5 * s.chars().count();
        assert_eq!(fit_whole("ab", 3, &heavy), ["a", "b"]);
    }

    #[test]
    fn a_one_megabyte_line_is_cut_with_few_counts() {
        let text = "x".repeat(1 << 20);
        let calls = Cell::new(0usize);
        let counted_bytes = Cell::new(0usize);
        let count = |s: &str| {
            calls.set(calls.get() + 1);
            counted_bytes.set(counted_bytes.get() + s.len());
            s.len()
        };
        let pieces = fit_whole(&text, 1000, &count);
        assert_eq!(pieces.len(), (1 << 20) / 1000 + 1);
        assert!(pieces.iter().all(|p| p.len() <= 1000));
        // Exponential + binary search: about 20 counts of at most ~2 pieces' length per piece.
        assert!(calls.get() < 25 * pieces.len(), "{} calls", calls.get());
        assert!(
            counted_bytes.get() < 40 * text.len(),
            "{} bytes",
            counted_bytes.get()
        );
    }

    #[test]
    fn many_paragraphs_are_counted_a_linear_number_of_times() {
        let text = "word word word\n\n".repeat(10_000);
        let counted_bytes = Cell::new(0usize);
        let count = |s: &str| {
            counted_bytes.set(counted_bytes.get() + s.len());
            words(s)
        };
        let pieces = fit_whole(&text, 30, &count);
        assert_eq!(pieces.len(), 1000);
        // Whole text once, each paragraph once, each group once.
        assert!(
            counted_bytes.get() <= 3 * text.len(),
            "{} bytes",
            counted_bytes.get()
        );
    }
}
