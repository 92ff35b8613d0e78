//! The records stage: what the index stores of a document: each section's text, its byte and
//! code-point offsets in the document, and its key in the dense index, all of one version.

use super::SentencedDocument;
use crate::content_hash::content_hash;
use crate::index::{gap_after, section_key};
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
    let mut sentenced_sections = sentenced_sections.into_iter().enumerate().peekable();
    while let Some((ordinal, section)) = sentenced_sections.next() {
        let next_start = sentenced_sections.peek().map(|(_, next)| next.span.start);
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
            gap_after: gap_after(&text, span.end, next_start).to_string(),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ingest::SentencedSection;
    use crate::sections::SectionSpan;
    use crate::types::DocumentFormat;

    fn document(text: &str) -> DocumentInput {
        DocumentInput {
            id: "d".into(),
            title: "T".into(),
            text: text.into(),
            format: DocumentFormat::Plain,
            metadata: BTreeMap::from([("k".to_string(), "v".to_string())]),
            sections: None,
        }
    }

    fn section(start: usize, end: usize) -> SentencedSection {
        SentencedSection {
            span: SectionSpan {
                start,
                end,
                heading_path: Vec::new(),
            },
            sentences: Vec::new(),
            sentence_vectors: Vec::new(),
            section_vector: Vec::new(),
        }
    }

    /// Versions are stored (they make the dense-index keys): the bytes hashed must stay the ones
    /// the service hashed before the stage had a file of its own.
    #[test]
    fn the_version_hashes_title_text_and_metadata_as_it_always_did() {
        let document = document("héllo");
        let mut hasher = blake3::Hasher::new();
        for part in [&b"T"[..], &[0], "héllo".as_bytes(), &[0], b"k", &[0], b"v"] {
            hasher.update(part);
        }
        let expected = u64::from_le_bytes(hasher.finalize().as_bytes()[..8].try_into().unwrap());
        assert_eq!(document_version(&document), expected);
        let mut changed = document.clone();
        changed.metadata.insert("k".into(), "w".into());
        assert_ne!(document_version(&changed), expected);
    }

    #[test]
    fn sections_get_code_point_offsets_and_keys_of_their_version() {
        let text = "héllo wörld again";
        let start = text.find("again").unwrap();
        let sentenced = SentencedDocument {
            document: document(text),
            text: text.into(),
            sections: vec![section(0, 6), section(start, text.len())],
        };
        let record = record(sentenced);
        assert_eq!(record.sections.len(), 2);
        let second = &record.sections[1];
        assert_eq!(second.text, "again");
        assert_eq!(second.byte_start, start as u64);
        assert_eq!(second.char_start, text[..start].chars().count() as u64);
        assert_eq!(second.ordinal, 1);
        assert_eq!(second.section_key, section_key("d", 1, record.version));
        assert_eq!(record.text_bytes, text.len() as u64);
        assert_eq!(
            record.sections[0].gap_after, "",
            "\"héllo \" ends at its space"
        );
        assert_eq!(second.gap_after, "", "the last section");
    }

    /// A section stores the whitespace up to the next one, so that the two can be read as one
    /// passage: `text + gap_after` runs exactly up to the next section's start.
    #[test]
    fn each_section_keeps_the_whitespace_before_the_next() {
        let text = "First one.\n\n  Second, cut here. Third\tpiece. x Fourth.";
        let at = |needle: &str| text.find(needle).unwrap();
        let spans = [
            (0, at("\n")),
            (at("Second"), at(" Third")),
            (at("Third"), at(" x")),
            // "x" belongs to no section: nothing joins the third to the fourth.
            (at("Fourth"), text.len()),
        ];
        let sentenced = SentencedDocument {
            document: document(text),
            text: text.into(),
            sections: spans.iter().map(|&(s, e)| section(s, e)).collect(),
        };
        let record = record(sentenced);
        let gaps: Vec<&str> = record
            .sections
            .iter()
            .map(|s| s.gap_after.as_str())
            .collect();
        assert_eq!(gaps, ["\n\n  ", " ", "", ""]);
        for pair in record.sections.windows(2) {
            if !pair[0].gap_after.is_empty() {
                let end =
                    pair[0].byte_start as usize + pair[0].text.len() + pair[0].gap_after.len();
                assert_eq!(end as u64, pair[1].byte_start);
            }
        }
    }
}
