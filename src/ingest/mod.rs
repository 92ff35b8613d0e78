//! The ingest pipeline, the mirror of [`crate::query`]. The service runs the stages in order (the
//! CPU work on the pool); no stage calls another. The types handed from one stage to the next are
//! defined here.
//!
//! ```text
//! Vec<DocumentInput>
//!   └─ validate::validate_batch  → (checked)              batch size, ids, text size, HTML depth
//!   └─ section::section          → SectionedDocument      text cut into sections (caller's or by structure)
//!   └─ sentences::sentences      → SentencedDocument      sentence ranges of each section
//!   └─ embed::embed              → SentencedDocument      + sentence and section vectors (with a model)
//!   └─ records::record           → DocumentRecord         what the index stores: offsets, keys, version
//! ```

pub mod embed;
pub mod records;
pub mod section;
pub mod sentences;
pub mod validate;

use std::ops::Range;

use crate::sections::SectionSpan;
use crate::types::DocumentInput;

/// A document cut into sections.
#[derive(Clone, Debug)]
pub struct SectionedDocument {
    /// The document as it came (its title, metadata and original text make its version).
    pub document: DocumentInput,
    /// The text the sections index into: the document's own, or the text extracted from HTML.
    pub text: String,
    pub spans: Vec<SectionSpan>,
}

/// A document whose sections know their sentences (and, after the embed stage, their vectors).
#[derive(Clone, Debug)]
pub struct SentencedDocument {
    pub document: DocumentInput,
    pub text: String,
    pub sections: Vec<SentencedSection>,
}

#[derive(Clone, Debug)]
pub struct SentencedSection {
    pub span: SectionSpan,
    /// Sentence byte ranges in the section's text.
    pub sentences: Vec<Range<u32>>,
    /// `QuantizedVectors` bytes, one row per sentence; empty without the neural stage.
    pub sentence_vectors: Vec<u8>,
    /// One-row `QuantizedVectors` bytes of the section's vector; empty without the neural stage.
    pub section_vector: Vec<u8>,
}

impl SentencedDocument {
    /// The text of section `i`.
    pub fn section_text(&self, i: usize) -> &str {
        let span = &self.sections[i].span;
        &self.text[span.start..span.end]
    }
}
