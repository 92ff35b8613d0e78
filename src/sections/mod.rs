//! Ingest-time sectioning (interim: blank-line paragraphs for every format; the full module
//! replaces this file).
use std::borrow::Cow;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Plain,
    Markdown,
    Html,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionSpan {
    pub start: usize,
    pub end: usize,
    pub heading_path: Vec<String>,
}

pub struct ParsedDocument<'a> {
    pub text: Cow<'a, str>,
    pub sections: Vec<SectionSpan>,
}

#[derive(Debug, thiserror::Error)]
pub enum SectionError {
    #[error("section {index}: {reason}")]
    Invalid { index: usize, reason: String },
}

pub fn split_document<'a>(
    text: &'a str,
    _format: Format,
    section_tokens: usize,
    count_tokens: &dyn Fn(&str) -> usize,
) -> ParsedDocument<'a> {
    let mut sections: Vec<SectionSpan> = Vec::new();
    let mut tokens_in_current = 0;
    let mut offset = 0;
    for paragraph in text.split("\n\n") {
        let start = offset + (paragraph.len() - paragraph.trim_start().len());
        let end = offset + paragraph.trim_end().len();
        offset += paragraph.len() + 2;
        if start >= end {
            continue;
        }
        let tokens = count_tokens(&text[start..end]);
        match sections.last_mut() {
            Some(last) if tokens_in_current + tokens <= section_tokens => {
                last.end = end;
                tokens_in_current += tokens;
            }
            _ => {
                sections.push(SectionSpan {
                    start,
                    end,
                    heading_path: Vec::new(),
                });
                tokens_in_current = tokens;
            }
        }
    }
    ParsedDocument {
        text: Cow::Borrowed(text),
        sections,
    }
}

pub fn caller_sections(
    text: &str,
    boundaries: &[(u64, u64, String)],
) -> Result<Vec<SectionSpan>, SectionError> {
    let total_chars = text.chars().count() as u64;
    let mut spans = Vec::with_capacity(boundaries.len());
    let mut previous_end = 0;
    for (index, (start, end, title)) in boundaries.iter().enumerate() {
        if start > end || *end > total_chars || *start < previous_end {
            return Err(SectionError::Invalid {
                index,
                reason: format!("range {start}..{end} must be ordered, non-overlapping and within 0..={total_chars} code points"),
            });
        }
        previous_end = *end;
        let byte = |c: u64| {
            text.char_indices()
                .nth(c as usize)
                .map_or(text.len(), |(b, _)| b)
        };
        let heading_path = if title.is_empty() {
            Vec::new()
        } else {
            vec![title.clone()]
        };
        spans.push(SectionSpan {
            start: byte(*start),
            end: byte(*end),
            heading_path,
        });
    }
    Ok(spans)
}
