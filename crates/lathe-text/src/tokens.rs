//! Token offsets of one text: the single tokenization pass that chunking, scoring and packing cut
//! against. A section is tokenized once (and the result cached by content hash); every later stage
//! works on byte ranges into it and never re-tokenizes candidate pieces.
//!
//! # Honest counts of huge tokens
//! A tokenizer can give one token for any amount of text: WordPiece maps a word of over 100 chars
//! to a single `[UNK]`, and drops whitespace, control chars and stripped accents without a token.
//! Counted as the tokenizer says, a 10 MB word is 1 token and fits any budget. So the budget
//! tokenizer's spans are bounded ([`TokenOffsets::bounded_from_spans`], [`SpanBounder`]): a
//! token longer than [`MAX_TOKEN_BYTES`] counts as one token per started [`MAX_TOKEN_BYTES`], cut
//! at char boundaries, a stretch of more than [`MAX_TOKEN_BYTES`] that lies in no token is
//! covered by tokens of the same size, and a non-empty text in which the tokenizer found nothing
//! counts as one token. Afterwards no token spans more than [`MAX_TOKEN_BYTES`], no more than
//! [`MAX_TOKEN_BYTES`] lie before, between or after tokens, and a non-empty text has a token; so a
//! text of `k` counted tokens holds at most `(2 * k + 1) * MAX_TOKEN_BYTES`, that is at most
//! `k * MAX_BYTES_PER_TOKEN` bytes, whatever the tokenizer. Ordinary text is unaffected.

use std::ops::Range;

mod sentence_bounds;

pub use sentence_bounds::sentence_bound_indices;

/// Most bytes one counted token spans, and most bytes that may lie between two tokens uncounted.
/// Real tokens are far shorter (the longest WordPiece token of MiniLM is 18 bytes, and tiktoken's
/// vocabularies hold a few of up to 128 bytes, runs of spaces or dashes), so ordinary text counts
/// exactly as the tokenizer says.
pub const MAX_TOKEN_BYTES: usize = 128;

/// Most bytes of text per counted token (see the module doc): `k >= 1` tokens and the `k + 1`
/// stretches around them, each of at most [`MAX_TOKEN_BYTES`]. Text packed into a budget is at
/// most the budget times this.
pub const MAX_BYTES_PER_TOKEN: usize = 3 * MAX_TOKEN_BYTES;

/// Byte spans of the tokens of one text, in order.
///
/// Invariants (upheld by [`TokenOffsets::from_spans`]): every start and end lies on a char boundary
/// of the text; `starts` and `ends` are non-decreasing; `starts[i] <= ends[i]`. A byte-level BPE can
/// split one char over several tokens: those tokens are widened to the whole char, so they share a
/// span. Whitespace between tokens belongs to no token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenOffsets {
    starts: Vec<u32>,
    ends: Vec<u32>,
}

impl TokenOffsets {
    /// Builds offsets from raw token byte spans over `text`, snapping each span outwards to char
    /// boundaries and clamping it to the text.
    pub fn from_spans(text: &str, spans: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let spans = spans.into_iter();
        let (lower, _) = spans.size_hint();
        let mut starts = Vec::with_capacity(lower);
        let mut ends = Vec::with_capacity(lower);
        let mut last_start = 0u32;
        let mut last_end = 0u32;
        for (start, end) in spans {
            let start = floor_char_boundary(text, start.min(text.len()));
            let end = ceil_char_boundary(text, end.min(text.len()).max(start));
            // Tokenizers emit spans in order; a decreasing one can only come from an overlapping
            // special token and is clamped so that the offsets stay sorted.
            let start = (start as u32).max(last_start);
            let end = (end as u32).max(last_end).max(start);
            starts.push(start);
            ends.push(end);
            last_start = start;
            last_end = end;
        }
        Self { starts, ends }
    }

    /// [`Self::from_spans`], then bounded (see the module doc): a span longer than
    /// [`MAX_TOKEN_BYTES`] becomes one token per started [`MAX_TOKEN_BYTES`], a stretch longer
    /// than that in no token (before, between or after the spans) is covered by such tokens, and
    /// a non-empty text without spans is one token.
    pub fn bounded_from_spans(text: &str, spans: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let spans = spans.into_iter();
        let (lower, _) = spans.size_hint();
        let mut offsets = Self {
            starts: Vec::with_capacity(lower),
            ends: Vec::with_capacity(lower),
        };
        let mut bounder = SpanBounder::new(text);
        let mut push = |start: usize, end: usize| {
            offsets.starts.push(start as u32);
            offsets.ends.push(end as u32);
        };
        for (start, end) in spans {
            bounder.push(start, end, &mut push);
        }
        bounder.finish(&mut push);
        offsets
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Start byte of token `i`.
    pub fn start(&self, i: usize) -> usize {
        self.starts[i] as usize
    }

    /// End byte (exclusive) of token `i`.
    pub fn end(&self, i: usize) -> usize {
        self.ends[i] as usize
    }

    pub fn starts(&self) -> &[u32] {
        &self.starts
    }

    pub fn ends(&self) -> &[u32] {
        &self.ends
    }

    /// Index range of the tokens that lie wholly inside `bytes`.
    pub fn tokens_within(&self, bytes: Range<usize>) -> Range<usize> {
        let first = self.starts.partition_point(|&s| (s as usize) < bytes.start);
        let last = self.ends.partition_point(|&e| (e as usize) <= bytes.end);
        first..last.max(first)
    }

    /// Number of tokens that lie wholly inside `bytes`.
    pub fn count_within(&self, bytes: Range<usize>) -> usize {
        self.tokens_within(bytes).len()
    }

    /// Each run of non-whitespace chars as one token: a tokenizer-free stand-in (fallback when a
    /// tokenizer fails, and the cheap tokenizer of property tests and fuzz targets).
    pub fn whitespace(text: &str) -> Self {
        let spans = text.split_whitespace().map(|word| {
            let start = word.as_ptr() as usize - text.as_ptr() as usize;
            (start, start + word.len())
        });
        Self::from_spans(text, spans)
    }

    /// Heap bytes held, for cache weighers.
    pub fn heap_bytes(&self) -> usize {
        (self.starts.capacity() + self.ends.capacity()) * std::mem::size_of::<u32>()
    }
}

/// Turns raw token spans, pushed in order, into bounded ones (see the module doc): snapped
/// outwards to char boundaries, kept sorted, long ones cut and long gaps covered.
pub struct SpanBounder<'t> {
    text: &'t str,
    last_start: usize,
    /// End of the text covered so far (by a token or a gap cover).
    covered_to: usize,
    any_span: bool,
}

impl<'t> SpanBounder<'t> {
    pub fn new(text: &'t str) -> Self {
        Self {
            text,
            last_start: 0,
            covered_to: 0,
            any_span: false,
        }
    }

    /// Takes the next raw span and hands the bounded tokens it gives to `emit(start, end)`.
    pub fn push(&mut self, start: usize, end: usize, emit: &mut impl FnMut(usize, usize)) {
        let text = self.text;
        let start = floor_char_boundary(text, start.min(text.len()));
        let end = ceil_char_boundary(text, end.min(text.len()).max(start));
        // Tokenizers emit spans in order; a decreasing one can only come from an overlapping
        // special token and is clamped so that the offsets stay sorted.
        let start = start.max(self.last_start);
        if start > self.covered_to + MAX_TOKEN_BYTES {
            cover(text, self.covered_to, start, emit);
        }
        let end = end.max(self.covered_to).max(start);
        if end - start <= MAX_TOKEN_BYTES {
            emit(start, end);
        } else {
            // A piece starting inside the previous token (a char split between tokens) must not
            // end before it: ends stay sorted.
            let covered_to = self.covered_to;
            cover(text, start, end, &mut |a, b| emit(a, b.max(covered_to)));
        }
        self.last_start = start;
        self.covered_to = end;
        self.any_span = true;
    }

    /// Covers a long stretch after the last span; gives a non-empty text without spans its one
    /// token.
    pub fn finish(self, emit: &mut impl FnMut(usize, usize)) {
        if self.text.len() > self.covered_to + MAX_TOKEN_BYTES {
            cover(self.text, self.covered_to, self.text.len(), emit);
        } else if !self.any_span && !self.text.is_empty() {
            emit(0, self.text.len());
        }
    }

    /// [`Self::finish`] for a part of a longer text that holds a token elsewhere: a long stretch
    /// after the last span is covered, but a part without spans gets no token of its own (it lies
    /// in the stretch between two tokens of the whole).
    pub fn finish_part(self, emit: &mut impl FnMut(usize, usize)) {
        if self.text.len() > self.covered_to + MAX_TOKEN_BYTES {
            cover(self.text, self.covered_to, self.text.len(), emit);
        }
    }
}

/// Emits `from..to` as consecutive pieces of at most [`MAX_TOKEN_BYTES`], cut at char boundaries
/// (`from` and `to` lie on char boundaries).
fn cover(text: &str, from: usize, to: usize, emit: &mut impl FnMut(usize, usize)) {
    let mut position = from;
    while position < to {
        let mut next = floor_char_boundary(text, position + MAX_TOKEN_BYTES).min(to);
        if next <= position {
            next = ceil_char_boundary(text, position + 1).min(to);
        }
        emit(position, next);
        position = next;
    }
}

/// The largest char boundary `<= index`.
pub fn floor_char_boundary(text: &str, index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    let mut i = index;
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest char boundary `>= index`.
pub fn ceil_char_boundary(text: &str, index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    let mut i = index;
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_splitting_a_char_are_widened_to_it() {
        let text = "a😀b";
        // A byte-level BPE could give the emoji's four bytes as two tokens.
        let offsets = TokenOffsets::from_spans(text, [(0, 1), (1, 3), (3, 5), (5, 6)]);
        assert_eq!(offsets.starts(), &[0, 1, 1, 5]);
        assert_eq!(offsets.ends(), &[1, 5, 5, 6]);
        for i in 0..offsets.len() {
            assert!(text.is_char_boundary(offsets.start(i)));
            assert!(text.is_char_boundary(offsets.end(i)));
        }
    }

    fn bounded(text: &str, spans: &[(usize, usize)]) -> Vec<(u32, u32)> {
        let offsets = TokenOffsets::bounded_from_spans(text, spans.iter().copied());
        offsets
            .starts()
            .iter()
            .copied()
            .zip(offsets.ends().iter().copied())
            .collect()
    }

    #[test]
    fn ordinary_spans_are_kept_as_they_are() {
        let text = "one two three";
        let spans = [(0, 3), (4, 7), (8, 13)];
        assert_eq!(bounded(text, &spans), [(0, 3), (4, 7), (8, 13)]);
        assert_eq!(
            TokenOffsets::bounded_from_spans(text, spans),
            TokenOffsets::from_spans(text, spans)
        );
    }

    #[test]
    fn a_long_span_counts_one_token_per_started_limit_cut_at_chars() {
        let text = format!("a {}", "é".repeat(200)); // 400 bytes of two-byte chars
        let tokens = bounded(&text, &[(0, 1), (2, text.len())]);
        // 128 is a char boundary here (even offset from 2): pieces of 128, 128, 128 and 16.
        assert_eq!(
            tokens,
            [(0, 1), (2, 130), (130, 258), (258, 386), (386, 402)]
        );
        let odd = format!("ab{}", "é".repeat(100)); // pieces must end on char boundaries
        for (start, end) in bounded(&odd, &[(0, odd.len())]) {
            assert!(odd.is_char_boundary(start as usize) && odd.is_char_boundary(end as usize));
            assert!(end - start <= MAX_TOKEN_BYTES as u32);
        }
    }

    #[test]
    fn a_long_stretch_in_no_token_is_covered_and_a_short_one_is_not() {
        let text = format!("a{}b{}c", " ".repeat(128), " ".repeat(300));
        let a = 0;
        let b = 129;
        let c = text.len() - 1;
        let tokens = bounded(&text, &[(a, a + 1), (b, b + 1), (c, c + 1)]);
        assert_eq!(
            tokens,
            [
                (0, 1),
                (129, 130),
                (130, 258),
                (258, 386),
                (386, 430),
                (430, 431)
            ]
        );
        // Before the first and after the last span too.
        let edges = format!("{}x{}", " ".repeat(200), " ".repeat(200));
        assert_eq!(bounded(&edges, &[(200, 201)]).len(), 2 + 1 + 2);
    }

    #[test]
    fn a_text_without_tokens_counts_one_and_an_empty_one_none() {
        assert_eq!(bounded("\u{1}\u{2}", &[]), [(0, 2)]);
        assert_eq!(bounded(" ", &[]), [(0, 1)]);
        assert!(bounded("", &[]).is_empty());
    }

    #[test]
    fn overlapping_widened_spans_stay_sorted_when_cut() {
        // Two tokens share the emoji; the second runs on for 300 bytes.
        let text = format!("😀{}", "x".repeat(300));
        let tokens = bounded(&text, &[(0, 2), (2, text.len())]);
        for pair in tokens.windows(2) {
            assert!(
                pair[0].0 <= pair[1].0 && pair[0].1 <= pair[1].1,
                "{tokens:?}"
            );
        }
        assert!(tokens.iter().all(|(s, e)| e - s <= MAX_TOKEN_BYTES as u32));
    }

    #[test]
    fn counts_tokens_wholly_inside_a_range() {
        let text = "one two three";
        let offsets = TokenOffsets::from_spans(text, [(0, 3), (4, 7), (8, 13)]);
        assert_eq!(offsets.count_within(0..text.len()), 3);
        assert_eq!(offsets.count_within(0..7), 2);
        assert_eq!(offsets.count_within(1..7), 1);
        assert_eq!(offsets.count_within(5..6), 0);
        assert_eq!(offsets.tokens_within(4..13), 1..3);
    }
}
