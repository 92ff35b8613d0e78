//! The baseline chunker: LangChain's `RecursiveCharacterTextSplitter`, reimplemented faithfully
//! so the baseline is what users run today, with exact offsets instead of `str.find`.
//!
//! Semantics (langchain-text-splitters 1.1.3, `character.py` and `base.py`) with the defaults
//! `keep_separator=True` (the separator starts the following piece), `strip_whitespace=True`,
//! `is_separator_regex=False` and `length_function=len` (Python string length: code points):
//! 1. Take the first separator that occurs in the text (`""` always matches and means
//!    characters); the ones after it are used to split pieces that are still too long.
//! 2. Split the text before each occurrence of that separator.
//! 3. Pieces shorter than `chunk_size` are collected and merged greedily into chunks of at most
//!    `chunk_size`; when a chunk is emitted, pieces are dropped from its front until at most
//!    `chunk_overlap` remain, and these start the next chunk. A piece of `chunk_size` or more is
//!    split recursively with the remaining separators (or emitted as it is when none remain).
//! 4. Each merged chunk is stripped of surrounding whitespace; empty chunks are dropped.
//!
//! The `text-splitter` crate was not used: it splits on Unicode semantic levels (sentences,
//! words, graphemes), trims differently and packs overlap differently, so it would not be the
//! LangChain baseline.

use std::ops::Range;

/// LangChain's default separators.
pub const DEFAULT_SEPARATORS: [&str; 4] = ["\n\n", "\n", " ", ""];

#[derive(Clone, Copy, Debug)]
pub struct RecursiveCharacterSplitter<'a> {
    /// Largest chunk in code points (LangChain `chunk_size`).
    pub chunk_size: usize,
    /// Overlap carried into the next chunk, in code points (LangChain `chunk_overlap`).
    pub chunk_overlap: usize,
    pub separators: &'a [&'a str],
}

impl<'a> RecursiveCharacterSplitter<'a> {
    pub fn new(chunk_size: usize, chunk_overlap: usize) -> Self {
        Self {
            chunk_size,
            chunk_overlap,
            separators: &DEFAULT_SEPARATORS,
        }
    }

    /// The chunks of `text` as byte ranges, in order (they overlap when `chunk_overlap > 0`).
    pub fn split_bytes(&self, text: &str) -> Vec<Range<usize>> {
        let mut chunks = Vec::new();
        self.split_range(text, 0..text.len(), self.separators, &mut chunks);
        chunks
    }

    /// The chunks of `text` as code-point ranges, in order.
    pub fn split_chars(&self, text: &str) -> Vec<Range<u64>> {
        let chunks = self.split_bytes(text);
        let mut boundaries: Vec<usize> = chunks.iter().flat_map(|r| [r.start, r.end]).collect();
        boundaries.sort_unstable();
        boundaries.dedup();
        // One walk over the text converts every boundary.
        let mut char_of_byte = Vec::with_capacity(boundaries.len());
        let mut next = 0usize;
        let ends = text.char_indices().map(|(b, _)| b);
        for (chars_before, byte) in ends.chain(std::iter::once(text.len())).enumerate() {
            while next < boundaries.len() && boundaries[next] == byte {
                char_of_byte.push((byte, chars_before as u64));
                next += 1;
            }
        }
        let to_char = |byte: usize| {
            char_of_byte
                .binary_search_by_key(&byte, |&(b, _)| b)
                .map_or(0, |i| char_of_byte[i].1)
        };
        chunks
            .into_iter()
            .map(|r| to_char(r.start)..to_char(r.end))
            .collect()
    }

    fn split_range(
        &self,
        text: &str,
        range: Range<usize>,
        separators: &[&str],
        out: &mut Vec<Range<usize>>,
    ) {
        let piece = &text[range.clone()];
        let mut separator = separators.last().copied().unwrap_or("");
        let mut remaining: &[&str] = &[];
        for (i, &candidate) in separators.iter().enumerate() {
            if candidate.is_empty() {
                separator = candidate;
                break;
            }
            if piece.contains(candidate) {
                separator = candidate;
                remaining = &separators[i + 1..];
                break;
            }
        }
        let splits = split_keeping_separator(piece, separator, range.start);
        let mut good: Vec<Range<usize>> = Vec::new();
        for split in splits {
            if char_len(text, &split) < self.chunk_size {
                good.push(split);
                continue;
            }
            if !good.is_empty() {
                self.merge(text, &good, out);
                good.clear();
            }
            if remaining.is_empty() {
                // LangChain appends such a piece as it is, unstripped.
                out.push(split);
            } else {
                self.split_range(text, split, remaining, out);
            }
        }
        if !good.is_empty() {
            self.merge(text, &good, out);
        }
    }

    /// `TextSplitter._merge_splits` with an empty join separator (`keep_separator=True`): the
    /// splits are neighbours in the text, so a merged chunk is one contiguous range.
    fn merge(&self, text: &str, splits: &[Range<usize>], out: &mut Vec<Range<usize>>) {
        let mut current: std::collections::VecDeque<(Range<usize>, usize)> =
            std::collections::VecDeque::new();
        let mut total = 0usize;
        for split in splits {
            let length = char_len(text, split);
            if total + length > self.chunk_size && !current.is_empty() {
                push_stripped(text, joined(&current), out);
                while total > self.chunk_overlap || (total + length > self.chunk_size && total > 0)
                {
                    match current.pop_front() {
                        Some((_, front_length)) => total -= front_length,
                        None => break,
                    }
                }
            }
            current.push_back((split.clone(), length));
            total += length;
        }
        if !current.is_empty() {
            push_stripped(text, joined(&current), out);
        }
    }
}

fn joined(current: &std::collections::VecDeque<(Range<usize>, usize)>) -> Range<usize> {
    let start = current.front().map_or(0, |(r, _)| r.start);
    let end = current.back().map_or(start, |(r, _)| r.end);
    start..end
}

fn char_len(text: &str, range: &Range<usize>) -> usize {
    text[range.clone()].chars().count()
}

/// Python's `str.isspace`: Unicode White_Space plus the ASCII information separators.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn push_stripped(text: &str, range: Range<usize>, out: &mut Vec<Range<usize>>) {
    let piece = &text[range.clone()];
    let start_trimmed = piece.trim_start_matches(is_python_space);
    let lead = piece.len() - start_trimmed.len();
    let trimmed = start_trimmed.trim_end_matches(is_python_space);
    if trimmed.is_empty() {
        return;
    }
    out.push(range.start + lead..range.start + lead + trimmed.len());
}

/// `re.split(f"({sep})", text)` recombined with the separator at the start of each following
/// piece, empty pieces dropped; `""` splits into characters. Ranges are offset by `base`.
fn split_keeping_separator(piece: &str, separator: &str, base: usize) -> Vec<Range<usize>> {
    if separator.is_empty() {
        return piece
            .char_indices()
            .map(|(i, c)| base + i..base + i + c.len_utf8())
            .collect();
    }
    let mut splits = Vec::new();
    let mut start = 0usize;
    for (position, _) in piece.match_indices(separator) {
        if position > start {
            splits.push(base + start..base + position);
        }
        start = position;
    }
    if piece.len() > start {
        splits.push(base + start..base + piece.len());
    }
    splits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(text: &str, size: usize, overlap: usize) -> Vec<&str> {
        RecursiveCharacterSplitter::new(size, overlap)
            .split_bytes(text)
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    // Expected outputs below were produced by langchain-text-splitters 1.1.3:
    // RecursiveCharacterTextSplitter(chunk_size=..., chunk_overlap=...).split_text(text).

    #[test]
    fn paragraphs_are_merged_up_to_the_size() {
        let text = "aaa bbb\n\nccc ddd\n\neee fff ggg hhh iii\n\nj";
        assert_eq!(
            chunks(text, 20, 0),
            vec!["aaa bbb\n\nccc ddd", "eee fff ggg hhh iii", "j"]
        );
    }

    #[test]
    fn long_paragraphs_fall_back_to_words_with_overlap() {
        let text = "one two three four five six seven eight nine ten";
        assert_eq!(
            chunks(text, 15, 6),
            vec![
                "one two three",
                "three four",
                "four five six",
                "six seven",
                "seven eight",
                "eight nine ten"
            ]
        );
    }

    #[test]
    fn a_word_longer_than_the_size_is_cut_into_characters() {
        assert_eq!(
            chunks("abcdefghij xy", 4, 0),
            vec!["abcd", "efgh", "ij", "xy"]
        );
    }

    #[test]
    fn code_point_offsets_match_byte_offsets() {
        let text = "héllo wörld ünïcode\n\nnaïve café";
        let splitter = RecursiveCharacterSplitter::new(12, 3);
        let bytes = splitter.split_bytes(text);
        let chars = splitter.split_chars(text);
        assert_eq!(bytes.len(), chars.len());
        for (b, c) in bytes.iter().zip(&chars) {
            let by_chars: String = text
                .chars()
                .skip(c.start as usize)
                .take((c.end - c.start) as usize)
                .collect();
            assert_eq!(&text[b.clone()], by_chars);
        }
    }

    #[test]
    fn chunks_never_exceed_the_size_when_words_fit() {
        let text = "lorem ipsum dolor sit amet consectetur\n\nadipiscing elit sed do\neiusmod tempor incididunt ut labore et dolore magna aliqua";
        for (size, overlap) in [(10, 0), (25, 5), (40, 10)] {
            for chunk in chunks(text, size, overlap) {
                assert!(chunk.chars().count() <= size, "{chunk:?} over {size}");
                assert_eq!(chunk, chunk.trim());
            }
        }
    }

    #[test]
    fn empty_and_blank_texts_give_no_chunks() {
        assert!(chunks("", 10, 0).is_empty());
        assert!(chunks(" \n\n \n ", 10, 0).is_empty());
    }
}
