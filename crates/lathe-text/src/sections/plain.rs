//! Plain text: one raw section holding the whole text; [`super::fit`] then groups its paragraphs
//! (split at blank lines) greedily up to the section limit. Also the paragraph splitter that every
//! format's oversized sections are cut with first.

use std::ops::Range;

use super::RawSection;

/// The whole text as one raw section with no heading path; if it does not fit, fitting cuts it at
/// paragraph boundaries and groups the paragraphs greedily, in order, up to the limit.
pub(super) fn raw_sections(text: &str) -> Vec<RawSection> {
    vec![RawSection {
        range: 0..text.len(),
        heading_path: Vec::new(),
    }]
}

/// Appends to `paragraphs` the trimmed, non-empty paragraphs of `text[range]`: maximal runs of
/// non-blank lines, where a line holding only whitespace is blank.
pub(super) fn paragraph_ranges(
    text: &str,
    range: Range<usize>,
    paragraphs: &mut Vec<Range<usize>>,
) {
    let mut paragraph: Option<Range<usize>> = None;
    let mut line_start = range.start;
    for line in text[range].split_inclusive('\n') {
        let line_end = line_start + line.len();
        if line.chars().all(char::is_whitespace) {
            if let Some(finished) = paragraph.take() {
                push_trimmed(text, finished, paragraphs);
            }
        } else {
            match paragraph.as_mut() {
                Some(open) => open.end = line_end,
                None => paragraph = Some(line_start..line_end),
            }
        }
        line_start = line_end;
    }
    if let Some(finished) = paragraph {
        push_trimmed(text, finished, paragraphs);
    }
}

/// Appends to `words` the maximal runs of non-whitespace chars in `text[range]`.
pub(super) fn whitespace_separated_ranges(
    text: &str,
    range: Range<usize>,
    words: &mut Vec<Range<usize>>,
) {
    let mut word_start: Option<usize> = None;
    for (offset, ch) in text[range.clone()].char_indices() {
        let position = range.start + offset;
        match (ch.is_whitespace(), word_start) {
            (true, Some(start)) => {
                words.push(start..position);
                word_start = None;
            }
            (false, None) => word_start = Some(position),
            _ => {}
        }
    }
    if let Some(start) = word_start {
        words.push(start..range.end);
    }
}

/// `range` without leading and trailing whitespace, or `None` when nothing else is left.
pub(super) fn trimmed(text: &str, range: Range<usize>) -> Option<Range<usize>> {
    let slice = &text[range.clone()];
    let without_start = slice.trim_start();
    if without_start.is_empty() {
        return None;
    }
    let start = range.start + (slice.len() - without_start.len());
    let end = start + without_start.trim_end().len();
    Some(start..end)
}

/// Pushes `range` trimmed, unless it is whitespace only.
pub(super) fn push_trimmed(text: &str, range: Range<usize>, ranges: &mut Vec<Range<usize>>) {
    if let Some(range) = trimmed(text, range) {
        ranges.push(range);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paragraphs_of(text: &str) -> Vec<&str> {
        let mut ranges = Vec::new();
        paragraph_ranges(text, 0..text.len(), &mut ranges);
        ranges.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn paragraphs_split_at_blank_and_whitespace_only_lines() {
        let text = "  one\ntwo\n\nthree\n \t \nfour\r\n\r\nfive  ";
        assert_eq!(paragraphs_of(text), ["one\ntwo", "three", "four", "five"]);
    }

    #[test]
    fn paragraphs_of_whitespace_only_text_are_none() {
        assert!(paragraphs_of("").is_empty());
        assert!(paragraphs_of(" \n\n\t\n").is_empty());
    }

    #[test]
    fn words_are_whitespace_separated_runs() {
        let text = "  one,two\u{a0}three.\n\tfour ";
        let mut ranges = Vec::new();
        whitespace_separated_ranges(text, 1..text.len(), &mut ranges);
        let words: Vec<&str> = ranges.into_iter().map(|r| &text[r]).collect();
        assert_eq!(words, ["one,two", "three.", "four"]);
    }

    #[test]
    fn trimmed_keeps_char_boundaries() {
        let text = "\u{3000}é\u{a0}";
        let range = trimmed(text, 0..text.len()).expect("has a non-whitespace char");
        assert_eq!(&text[range], "é");
    }
}
