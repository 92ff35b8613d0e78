//! Sentence and clause boundaries beyond English.
//!
//! Sentences come from UAX #29 (`unicode-segmentation`), whose STerm/ATerm classes already cover
//! CJK (。！？), Devanagari (। ॥), Arabic (؟ ۔) and Myanmar (။) terminators. Two corrections on
//! top: no break after a common abbreviation, an initial or a dotted acronym (UAX #29 breaks
//! "Dr. Smith" and "U.S. Army"), and a break at the spaces between Thai words, which is how Thai
//! separates sentences (it has no terminator); the Thai test uses the Unicode Script property.

use std::ops::Range;

use unicode_script::{Script, UnicodeScript};

use crate::tokens::sentence_bound_indices;

/// Words that end with a period without ending a sentence. Compared exactly, so that "no." and
/// "Mar." in lower case (which end sentences) do not match "No." and "Mar.".
const ABBREVIATIONS: &[&str] = &[
    "Mr", "Mrs", "Ms", "Dr", "Prof", "Sr", "Jr", "St", "Mt", "vs", "etc", "cf", "al", "Inc", "Ltd",
    "Co", "Corp", "Fig", "Figs", "fig", "No", "Nos", "Vol", "vol", "Eq", "eq", "Sec", "sec", "Ch",
    "pp", "Gen", "Col", "Lt", "Sgt", "Capt", "Rev", "Hon", "approx", "Dept", "est", "Jan", "Feb",
    "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec", "Ave", "Blvd", "Rd",
    "viz", "resp", "Ph", "Jr", "Messrs", "Mme", "Mlle",
];

/// Punctuation after which an over-long sentence may be split.
pub(super) const CLAUSE_PUNCTUATION: &[char] = &[
    ',', ';', ':', '—', '–', '，', '；', '、', '：', '،', '؛', '၊',
];

/// Writes the byte ranges of the sentences of `text` into `out` (cleared first). Ranges are in
/// order, do not overlap, and hold no leading or trailing whitespace; whitespace-only stretches
/// get none. Every non-whitespace char of `text` lies in exactly one range.
pub fn sentences(text: &str, out: &mut Vec<Range<u32>>) {
    out.clear();
    if text.len() > u32::MAX as usize {
        return;
    }
    sentences_in(text, 0, text.len(), out);
}

/// Appends the sentences of `text[start..end]` (absolute offsets) to `out`.
pub(super) fn sentences_in(text: &str, start: usize, end: usize, out: &mut Vec<Range<u32>>) {
    let slice = &text[start..end];
    let mut pending_start: Option<usize> = None;
    for (offset, segment) in sentence_bound_indices(slice) {
        let segment_start = start + offset;
        let segment_end = segment_start + segment.len();
        let sentence_start = pending_start.unwrap_or(segment_start);
        if segment_end < end && ends_with_abbreviation(segment) {
            pending_start = Some(sentence_start);
            continue;
        }
        pending_start = None;
        push_sentence(text, sentence_start, segment_end, out);
    }
    if let Some(sentence_start) = pending_start {
        push_sentence(text, sentence_start, end, out);
    }
}

/// Pushes the trimmed `start..end`, split at spaces between two Thai letters.
fn push_sentence(text: &str, start: usize, end: usize, out: &mut Vec<Range<u32>>) {
    let piece = &text[start..end];
    // Thai letters are three-byte chars with lead byte 0xE0; skip the script test without one.
    if !piece.as_bytes().contains(&0xE0) {
        push_trimmed(text, start, end, out);
        return;
    }
    let mut piece_start = start;
    let mut previous: Option<char> = None;
    let mut space_run_start: Option<usize> = None;
    for (offset, c) in piece.char_indices() {
        if c.is_whitespace() {
            if space_run_start.is_none() {
                space_run_start = Some(start + offset);
            }
            continue;
        }
        if let (Some(run_start), Some(before)) = (space_run_start, previous) {
            if before.script() == Script::Thai && c.script() == Script::Thai {
                push_trimmed(text, piece_start, run_start, out);
                piece_start = start + offset;
            }
        }
        space_run_start = None;
        previous = Some(c);
    }
    push_trimmed(text, piece_start, end, out);
}

fn push_trimmed(text: &str, start: usize, end: usize, out: &mut Vec<Range<u32>>) {
    let piece = &text[start..end];
    let leading = piece.len() - piece.trim_start().len();
    let kept = piece.trim().len();
    if kept > 0 {
        let trimmed_start = start + leading;
        out.push(trimmed_start as u32..(trimmed_start + kept) as u32);
    }
}

/// Whether a UAX #29 segment ends in ". " after an abbreviation, an initial or a dotted acronym,
/// so that the break after it is a false one. A newline after the period keeps the break.
fn ends_with_abbreviation(segment: &str) -> bool {
    let body = segment.trim_end();
    if segment[body.len()..].contains('\n') {
        return false;
    }
    let Some(body) = body.strip_suffix('.') else {
        return false;
    };
    let word = body
        .rsplit(|c: char| c.is_whitespace() || matches!(c, '(' | '[' | '"' | '\'' | '“' | '‘'))
        .next()
        .unwrap_or("");
    if word.is_empty() {
        return false;
    }
    let mut chars = word.chars();
    if let (Some(only), None) = (chars.next(), chars.next()) {
        // "J. Smith": a single letter is an initial.
        return only.is_alphabetic();
    }
    if word.contains('.')
        && word.split('.').all(|part| {
            (1..=2).contains(&part.chars().count()) && part.chars().all(char::is_alphabetic)
        })
    {
        // "U.S", "e.g", "Ph.D".
        return true;
    }
    ABBREVIATIONS.contains(&word)
}

/// Calls `emit` with the pieces of `start..end` cut after clause punctuation.
pub(super) fn clause_pieces(
    text: &str,
    start: usize,
    end: usize,
    mut emit: impl FnMut(usize, usize),
) {
    let mut piece_start = start;
    for (offset, c) in text[start..end].char_indices() {
        if CLAUSE_PUNCTUATION.contains(&c) {
            let piece_end = start + offset + c.len_utf8();
            emit(piece_start, piece_end);
            piece_start = piece_end;
        }
    }
    if piece_start < end {
        emit(piece_start, end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<&str> {
        let mut ranges = Vec::new();
        sentences(text, &mut ranges);
        ranges
            .iter()
            .map(|r| &text[r.start as usize..r.end as usize])
            .collect()
    }

    #[test]
    fn english_abbreviations_and_numbers_do_not_break() {
        assert_eq!(
            split("Dr. Smith met Mr. Jones in the U.S. Army. Pi is 3.14 i.e. close. Fine, e.g. This one."),
            ["Dr. Smith met Mr. Jones in the U.S. Army.", "Pi is 3.14 i.e. close.", "Fine, e.g. This one."]
        );
        assert_eq!(
            split("J. R. R. Tolkien wrote. It sold."),
            ["J. R. R. Tolkien wrote.", "It sold."]
        );
        assert_eq!(
            split("I said no. Then I left."),
            ["I said no.", "Then I left."]
        );
    }

    #[test]
    fn cjk_devanagari_arabic_myanmar_thai_terminators_break() {
        assert_eq!(
            split("今天很好。你好吗？我很好！"),
            ["今天很好。", "你好吗？", "我很好！"]
        );
        assert_eq!(
            split("यह एक वाक्य है। यह दूसरा है॥ तीसरा"),
            ["यह एक वाक्य है।", "यह दूसरा है॥", "तीसरा"]
        );
        assert_eq!(
            split("هل أنت بخير؟ نعم أنا بخير۔ شكرا"),
            ["هل أنت بخير؟", "نعم أنا بخير۔", "شكرا"]
        );
        assert_eq!(split("မင်္ဂလာပါ။ နေကောင်းလား။"), ["မင်္ဂလာပါ။", "နေကောင်းလား။"]);
        assert_eq!(split("วันนี้อากาศดี ฉันไปตลาด"), ["วันนี้อากาศดี", "ฉันไปตลาด"]);
    }

    #[test]
    fn ranges_are_trimmed_and_skip_blank_stretches() {
        assert_eq!(split("  One.  \n\n  Two?  "), ["One.", "Two?"]);
        assert!(split(" \n\t ").is_empty());
        assert!(split("").is_empty());
    }

    #[test]
    fn clauses_keep_their_punctuation() {
        let text = "a, b; c：d";
        let mut pieces = Vec::new();
        clause_pieces(text, 0, text.len(), |a, b| pieces.push(&text[a..b]));
        assert_eq!(pieces, ["a,", " b;", " c：", "d"]);
    }
}
