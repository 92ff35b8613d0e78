//! Token offsets of one text: the single tokenization pass that chunking, scoring and packing cut
//! against. A section is tokenized once (and the result cached by content hash); every later stage
//! works on byte ranges into it and never re-tokenizes candidate pieces.

use std::ops::Range;

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
