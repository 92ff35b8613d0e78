//! Ingest-time sectioning: a whole document is cut into *sections* by its structure (Markdown and
//! HTML headings, plain-text paragraphs). Sections are what the coarse index (BM25 + dense) holds
//! and what query-time chunking later re-cuts, so each one must fit the section token limit.
//!
//! Flow: a format reader ([`markdown`], [`html`], [`plain`]) yields raw sections (byte ranges with
//! heading paths); [`fit`] trims them, drops empty ones and cuts every oversized one down
//! (paragraphs → sentences → words → graphemes → chars) until `count_tokens` says it fits.
//!
//! Guarantees of [`split_document`], for any input: sections are in order, do not overlap, lie on
//! char boundaries, are trimmed and never empty, cover every non-whitespace char of
//! [`ParsedDocument::text`], and each one counts at most `section_tokens` by `count_tokens`; the
//! one exception is a section of a single char that alone counts more (it cannot be cut).

mod fit;
mod html;
mod markdown;
mod plain;

use std::borrow::Cow;
use std::ops::Range;

pub use html::nesting_depth as html_nesting_depth;

/// How the input text is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Plain,
    Markdown,
    Html,
}

/// One section: a byte range of [`ParsedDocument::text`] with the titles of its enclosing headings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionSpan {
    /// Start byte, on a char boundary.
    pub start: usize,
    /// End byte (exclusive), on a char boundary.
    pub end: usize,
    /// Titles of the enclosing headings, outermost first, e.g. `["Install", "On Debian"]`; empty
    /// when the section lies before any heading or the format has none.
    pub heading_path: Vec<String>,
}

/// A document cut into sections.
pub struct ParsedDocument<'a> {
    /// Plain and Markdown: the input as is (borrowed). Html: the extracted text (owned).
    pub text: Cow<'a, str>,
    /// Sections in order, indexing into `text`.
    pub sections: Vec<SectionSpan>,
}

/// Why caller-given section boundaries were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SectionError {
    #[error(
        "section {index}: range {start}..{end} is out of range; start and end must lie in \
         0..={text_chars} (the text has {text_chars} code points)"
    )]
    OutOfRange {
        index: usize,
        start: u64,
        end: u64,
        text_chars: u64,
    },
    #[error("section {index}: start {start} is after end {end}; start must be <= end")]
    StartAfterEnd { index: usize, start: u64, end: u64 },
    #[error(
        "section {index}: start {start} overlaps or precedes section {previous_index}, which ends \
         at {previous_end}; sections must be in order and not overlap, so start must lie in \
         {previous_end}..={text_chars}"
    )]
    OverlapsPrevious {
        index: usize,
        start: u64,
        previous_index: usize,
        previous_end: u64,
        text_chars: u64,
    },
}

/// What sectioning counts with: any `Fn(&str) -> usize`, or the budget tokenizer, which can also
/// give token offsets.
pub trait TokenCounter {
    /// Tokens of `text`.
    fn count(&self, text: &str) -> usize;

    /// Start bytes of the tokens of `text`, in order, when the counter has them: an oversized
    /// word is then cut where its `section_tokens + 1`-th token starts (each cut verified with
    /// [`TokenCounter::count`]) instead of by a search that counts a prefix some twenty times.
    fn token_starts(&self, _text: &str) -> Option<Vec<u32>> {
        None
    }

    /// A number of tokens `text` is sure to hold, known without counting (0 when nothing is
    /// known): a text that surely holds more than the limit is cut without being counted.
    fn least_tokens(&self, _text: &str) -> usize {
        0
    }

    /// The tokenizer's own token spans of `text` (byte ranges, before [`crate::tokens`] bounds
    /// them), when the counter is *whitespace-local*: the spans it gives any range of `text`
    /// whose both ends touch whitespace (or the ends of `text`) are exactly those of `text` inside
    /// it, and its count of such a range is what [`crate::tokens::SpanBounder`] makes of them.
    /// Sectioning then tokenizes a raw section once and derives every count inside it. `None`
    /// (the default): every range is counted.
    fn local_spans(&self, _text: &str) -> Option<Vec<(u32, u32)>> {
        None
    }
}

impl<F: Fn(&str) -> usize + ?Sized> TokenCounter for F {
    fn count(&self, text: &str) -> usize {
        self(text)
    }
}

impl TokenCounter for crate::tokenizer::BudgetTokenizer {
    fn count(&self, text: &str) -> usize {
        crate::tokenizer::BudgetTokenizer::count(self, text)
    }

    fn token_starts(&self, text: &str) -> Option<Vec<u32>> {
        Some(self.offsets(text).starts().to_vec())
    }

    /// A text of `k` tokens holds at most `(2k + 1) * MAX_TOKEN_BYTES` bytes (see
    /// [`crate::tokens`]).
    fn least_tokens(&self, text: &str) -> usize {
        text.len()
            .div_ceil(crate::tokens::MAX_TOKEN_BYTES)
            .saturating_sub(1)
            / 2
    }

    fn local_spans(&self, text: &str) -> Option<Vec<(u32, u32)>> {
        crate::tokenizer::BudgetTokenizer::local_spans(self, text)
    }
}

/// Cuts `text` into sections by its structure (see the module doc for the guarantees).
///
/// `section_tokens` of 0 is treated as 1. `count_tokens` sees each raw section once, each piece of
/// an oversized one once, and each group of pieces once (plus a binary search when the summed
/// estimate was wrong), so the text it is given adds up to a small multiple of the document
/// (about 2.3x for Markdown READMEs at 256 MiniLM tokens), never to one count per pair of pieces.
/// A word too big for one section is cut in one pass over its token offsets when the counter
/// gives them (the budget tokenizer does), else by a search over its graphemes.
pub fn split_document<'a, C: TokenCounter + ?Sized>(
    text: &'a str,
    format: Format,
    section_tokens: usize,
    count_tokens: &C,
) -> ParsedDocument<'a> {
    let section_tokens = section_tokens.max(1);
    match format {
        Format::Plain => {
            let raw_sections = plain::raw_sections(text);
            let sections = fit::fit_sections(text, raw_sections, section_tokens, count_tokens);
            ParsedDocument {
                text: Cow::Borrowed(text),
                sections,
            }
        }
        Format::Markdown => {
            let headings = markdown::heading_marks(text);
            let raw_sections = sections_from_headings(text.len(), headings);
            let sections = fit::fit_sections(text, raw_sections, section_tokens, count_tokens);
            ParsedDocument {
                text: Cow::Borrowed(text),
                sections,
            }
        }
        Format::Html => {
            let extracted = html::extract_text(text);
            let raw_sections = sections_from_headings(extracted.text.len(), extracted.headings);
            let sections =
                fit::fit_sections(&extracted.text, raw_sections, section_tokens, count_tokens);
            ParsedDocument {
                text: Cow::Owned(extracted.text),
                sections,
            }
        }
    }
}

/// Caller-given sections, as code-point ranges `[start, end)` into `text` with optional titles
/// (an empty title gives an empty heading path): validated and converted to byte spans, kept as
/// they are (not trimmed, not re-split; an empty range is kept too).
pub fn caller_sections(
    text: &str,
    boundaries: &[(u64, u64, String)],
) -> Result<Vec<SectionSpan>, SectionError> {
    let text_chars = text.chars().count() as u64;
    let mut previous_end: Option<(usize, u64)> = None;
    for (index, &(start, end, _)) in boundaries.iter().enumerate() {
        if start > text_chars || end > text_chars {
            return Err(SectionError::OutOfRange {
                index,
                start,
                end,
                text_chars,
            });
        }
        if start > end {
            return Err(SectionError::StartAfterEnd { index, start, end });
        }
        if let Some((previous_index, previous_end)) = previous_end {
            if start < previous_end {
                return Err(SectionError::OverlapsPrevious {
                    index,
                    start,
                    previous_index,
                    previous_end,
                    text_chars,
                });
            }
        }
        previous_end = Some((index, end));
    }

    // Positions are now non-decreasing, so one forward walk over the chars converts them all.
    let mut byte_offsets = text
        .char_indices()
        .map(|(byte, _)| byte)
        .chain(std::iter::once(text.len()));
    let mut cursor_chars = 0u64;
    let mut cursor_byte = 0usize;
    if let Some(first) = byte_offsets.next() {
        cursor_byte = first;
    }
    let mut to_byte = |char_position: u64| -> usize {
        while cursor_chars < char_position {
            cursor_chars += 1;
            cursor_byte = byte_offsets.next().unwrap_or(text.len());
        }
        cursor_byte
    };
    let sections = boundaries
        .iter()
        .map(|(start, end, title)| {
            let start = to_byte(*start);
            let end = to_byte(*end);
            let heading_path = if title.is_empty() {
                Vec::new()
            } else {
                vec![title.clone()]
            };
            SectionSpan {
                start,
                end,
                heading_path,
            }
        })
        .collect();
    Ok(sections)
}

/// Checks the guarantees of [`split_document`] on its output; `Err` says which one broke. For
/// tests, fuzzing and debug assertions.
pub fn check_section_invariants(
    text: &str,
    sections: &[SectionSpan],
    section_tokens: usize,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Result<(), String> {
    let section_tokens = section_tokens.max(1);
    let mut previous_end = 0usize;
    for (index, section) in sections.iter().enumerate() {
        let SectionSpan { start, end, .. } = *section;
        if start < previous_end {
            return Err(format!(
                "section {index} starts at {start}, before the previous end {previous_end}"
            ));
        }
        if start >= end || end > text.len() {
            return Err(format!(
                "section {index} has range {start}..{end} (text length {})",
                text.len()
            ));
        }
        if !text.is_char_boundary(start) || !text.is_char_boundary(end) {
            return Err(format!(
                "section {index} range {start}..{end} is off char boundaries"
            ));
        }
        let section_text = &text[start..end];
        if section_text.trim().len() != section_text.len() {
            return Err(format!(
                "section {index} is not trimmed or is whitespace-only: {section_text:?}"
            ));
        }
        let tokens = count_tokens(section_text);
        if tokens > section_tokens && section_text.chars().nth(1).is_some() {
            return Err(format!(
                "section {index} counts {tokens} tokens, over the limit {section_tokens}"
            ));
        }
        previous_end = end;
    }
    let mut section_iter = sections.iter().peekable();
    for (byte, ch) in text.char_indices() {
        if ch.is_whitespace() {
            continue;
        }
        while section_iter.peek().is_some_and(|s| s.end <= byte) {
            section_iter.next();
        }
        match section_iter.peek() {
            Some(section) if section.start <= byte => {}
            _ => return Err(format!("char {ch:?} at byte {byte} is in no section")),
        }
    }
    Ok(())
}

/// A heading found by a format reader: where its section starts in the text, its level (1–6) and
/// its plain title.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HeadingMark {
    start: usize,
    level: u8,
    title: String,
}

/// A structural section before fitting: a byte range (untrimmed, maybe empty) and its path.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RawSection {
    range: Range<usize>,
    heading_path: Vec<String>,
}

/// Turns heading marks (in text order) into raw sections: one before the first heading with an
/// empty path, then one from each heading to the next heading of any level, with the titles of
/// the enclosing headings by level as its path.
fn sections_from_headings(text_len: usize, headings: Vec<HeadingMark>) -> Vec<RawSection> {
    let mut sections = Vec::with_capacity(headings.len() + 1);
    let mut open_headings: Vec<(u8, String)> = Vec::new();
    let mut section_start = 0usize;
    let mut heading_path: Vec<String> = Vec::new();
    for heading in headings {
        // Readers emit marks in order; clamping keeps ranges sane should one ever not.
        let heading_start = heading.start.clamp(section_start, text_len);
        sections.push(RawSection {
            range: section_start..heading_start,
            heading_path: std::mem::take(&mut heading_path),
        });
        while open_headings
            .last()
            .is_some_and(|(level, _)| *level >= heading.level)
        {
            open_headings.pop();
        }
        open_headings.push((heading.level, heading.title));
        heading_path = open_headings
            .iter()
            .map(|(_, title)| title.clone())
            .collect();
        section_start = heading_start;
    }
    sections.push(RawSection {
        range: section_start..text_len,
        heading_path,
    });
    sections
}

/// Collapses every run of whitespace to one space and trims the ends (heading titles).
fn collapse_whitespace(text: &str) -> String {
    let mut collapsed = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !collapsed.is_empty() {
            collapsed.push(' ');
        }
        collapsed.push_str(word);
    }
    collapsed
}

#[cfg(test)]
mod tests;
