//! The records stage: what the index stores of a document: each section's text, its byte and
//! code-point offsets in the document, and its key in the dense index, all of one version.

use super::SentencedDocument;
use crate::content_hash::content_hash;
use crate::index::collection::section_key;
use crate::index::{DocumentRecord, SectionRecord};
use crate::types::DocumentInput;

pub fn record(sentenced: SentencedDocument) -> DocumentRecord {
    let SentencedDocument {
        document,
        text,
        sections: sentenced_sections,
    } = sentenced;
    let version = document_version(&document);
    // Code-point offsets: one running count over the text, sections being in order.
    let mut sections = Vec::with_capacity(sentenced_sections.len());
    let (mut counted_bytes, mut counted_chars) = (0usize, 0u64);
    for (ordinal, section) in sentenced_sections.into_iter().enumerate() {
        let span = section.span;
        if span.start < counted_bytes {
            counted_bytes = 0;
            counted_chars = 0;
        }
        counted_chars += text[counted_bytes..span.start].chars().count() as u64;
        counted_bytes = span.start;
        sections.push(SectionRecord {
            ordinal: ordinal as u64,
            heading_path: span.heading_path,
            text: text[span.start..span.end].to_string(),
            byte_start: span.start as u64,
            char_start: counted_chars,
            section_key: section_key(&document.id, ordinal as u64, version),
            sentences: section.sentences,
            sentence_vectors: section.sentence_vectors,
            section_vector: section.section_vector,
        });
    }
    DocumentRecord {
        doc_id: document.id,
        title: document.title,
        metadata: document.metadata,
        text_bytes: text.len() as u64,
        version,
        sections,
    }
}

/// A hash of everything the caller sent that a section's key must change with.
fn document_version(document: &DocumentInput) -> u64 {
    let metadata = document
        .metadata
        .iter()
        .flat_map(|(key, value)| [b"\0".as_slice(), key.as_bytes(), b"\0", value.as_bytes()]);
    content_hash(
        [document.title.as_bytes(), b"\0", document.text.as_bytes()]
            .into_iter()
            .chain(metadata),
    )
}
