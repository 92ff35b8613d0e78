//! The section stage: a document cut into sections, at the boundaries the caller gave or by its
//! structure (headings, paragraphs) within the collection's section size.

use super::SectionedDocument;
use crate::error::{LatheError, Result};
use crate::sections::{self, Format};
use crate::tokenizer::BudgetTokenizer;
use crate::types::{DocumentFormat, DocumentInput};

/// How a collection cuts documents into sections.
#[derive(Clone, Copy, Debug)]
pub struct SectionLimits {
    /// Target size of a section cut by structure, in budget tokens.
    pub section_tokens: usize,
    /// Most sections one document may produce.
    pub max_sections: usize,
}

pub fn section(
    document: DocumentInput,
    limits: SectionLimits,
    tokenizer: &BudgetTokenizer,
) -> Result<SectionedDocument> {
    let (text, spans) = match &document.sections {
        Some(boundaries) => {
            let boundaries: Vec<(u64, u64, String)> = boundaries
                .iter()
                .map(|b| (b.start, b.end, b.title.clone()))
                .collect();
            let spans =
                sections::caller_sections(&document.text, &boundaries).map_err(|error| {
                    LatheError::invalid(format!("documents[{}].sections", document.id), error)
                })?;
            (document.text.clone(), spans)
        }
        None => {
            let format = match document.format {
                DocumentFormat::Plain => Format::Plain,
                DocumentFormat::Markdown => Format::Markdown,
                DocumentFormat::Html => Format::Html,
            };
            let parsed =
                sections::split_document(&document.text, format, limits.section_tokens, tokenizer);
            (parsed.text.into_owned(), parsed.sections)
        }
    };
    if spans.len() > limits.max_sections {
        return Err(LatheError::invalid(
            format!("documents[{}].text", document.id),
            format!(
                "produces {} sections; the allowed range is 0..={}",
                spans.len(),
                limits.max_sections
            ),
        ));
    }
    Ok(SectionedDocument {
        document,
        text,
        spans,
    })
}
