//! The sentences stage: the sentence ranges of each section, stored with it so that neither the
//! embed stage nor query-time chunking segments the text again.

use super::{SectionedDocument, SentencedDocument, SentencedSection};

pub fn sentences(sectioned: SectionedDocument) -> SentencedDocument {
    let SectionedDocument {
        document,
        text,
        spans,
    } = sectioned;
    let sections = spans
        .into_iter()
        .map(|span| {
            let mut sentences = Vec::new();
            crate::chunk::sentences(&text[span.start..span.end], &mut sentences);
            SentencedSection {
                span,
                sentences,
                sentence_vectors: Vec::new(),
                section_vector: Vec::new(),
            }
        })
        .collect();
    SentencedDocument {
        document,
        text,
        sections,
    }
}
