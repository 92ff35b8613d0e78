//! The tantivy schema of a collection: one tantivy document per section, with everything that
//! query-time re-chunking needs stored beside the BM25-indexed text, and the analyzer of section
//! text, titles and queries. How a section document is written and read back is beside it, in
//! `section_document`.

use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions, FAST,
    INDEXED, STORED, STRING,
};
use tantivy::tokenizer::{
    AsciiFoldingFilter, LowerCaser, RemoveLongFilter, SimpleTokenizer, TextAnalyzer,
};
use tantivy::Index;

use super::stems::RememberingStemmer;

/// Name of the analyzer of section text and titles.
pub const ANALYZER: &str = "lathe_en";

/// Separator of a metadata term `key\u{1f}value`: defined with the domain types, where the edge
/// checks metadata keys against it.
pub use crate::types::METADATA_SEPARATOR;

/// Separator of the headings in a stored heading path (ASCII record separator).
pub const HEADING_SEPARATOR: char = '\u{1e}';

#[derive(Clone, Copy, Debug)]
pub struct SectionFields {
    /// The document id: indexed raw, for deletes and `doc_ids` filters; a fast field too, so
    /// that a section whose stored bytes are damaged can still be named by its document.
    pub doc_id: Field,
    /// 0-based position of the section in its document.
    pub ordinal: Field,
    /// 1 on a document's first section, so documents can be counted.
    pub head: Field,
    /// Bytes of the whole document text (on the head section only).
    pub doc_bytes: Field,
    /// Hash of the document version, the same on all sections of one upsert.
    pub version: Field,
    pub doc_title: Field,
    /// Heading path, joined by `HEADING_SEPARATOR`.
    pub heading_path: Field,
    /// Document title and heading path, analysed for BM25.
    pub title_text: Field,
    /// Section text: analysed for BM25 and stored for re-chunking.
    pub text: Field,
    pub byte_start: Field,
    pub char_start: Field,
    /// Metadata terms `key\u{1f}value`, indexed raw for filters.
    pub metadata_terms: Field,
    /// Metadata as a JSON object, stored to return with chunks.
    pub metadata_json: Field,
    /// Stable id of this version of the section: the key of its vector in the dense index.
    pub section_key: Field,
    /// Sentence byte ranges in the section text, as little-endian u32 pairs.
    pub sentence_ranges: Field,
    /// One int8 vector per sentence (`embed::QuantizedVectors` bytes); empty without the neural stage.
    pub sentence_vectors: Field,
    /// The section's own vector (one-row `QuantizedVectors`), from which the dense index is rebuilt.
    pub section_vector: Field,
    /// `StoredSection::checksum` of every other stored field of the section.
    pub section_checksum: Field,
    /// The whitespace before the next section (`SectionRecord::gap_after`), stored when not
    /// empty; `None` in an index created before gaps were stored ([`SchemaVersion::WithoutGaps`]),
    /// which keeps its schema and stores none.
    pub gap_after: Option<Field>,
}

/// The schemas a collection's index may have: each later one adds fields at the end, so the
/// field ids of the earlier ones hold in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaVersion {
    /// Before 2026-12-04: no `gap_after`.
    WithoutGaps,
    /// Today's: what new indexes are created with.
    Current,
}

/// Today's schema, the one new indexes are created with.
pub fn build_schema() -> (Schema, SectionFields) {
    build_schema_version(SchemaVersion::Current)
}

pub fn build_schema_version(version: SchemaVersion) -> (Schema, SectionFields) {
    let mut builder = Schema::builder();
    let analysed = |stored: bool| {
        let indexing = TextFieldIndexing::default()
            .set_tokenizer(ANALYZER)
            .set_index_option(IndexRecordOption::WithFreqs);
        let options = TextOptions::default().set_indexing_options(indexing);
        if stored {
            options.set_stored()
        } else {
            options
        }
    };
    let stored_u64 = NumericOptions::default().set_stored();
    let fields = SectionFields {
        doc_id: builder.add_text_field("doc_id", STRING | STORED | FAST),
        ordinal: builder.add_u64_field("ordinal", stored_u64.clone()),
        head: builder.add_u64_field("head", INDEXED),
        doc_bytes: builder.add_u64_field("doc_bytes", FAST),
        version: builder.add_u64_field("version", stored_u64.clone()),
        doc_title: builder.add_text_field("doc_title", STORED),
        heading_path: builder.add_text_field("heading_path", STORED),
        title_text: builder.add_text_field("title_text", analysed(false)),
        text: builder.add_text_field("text", analysed(true)),
        byte_start: builder.add_u64_field("byte_start", stored_u64.clone()),
        char_start: builder.add_u64_field("char_start", stored_u64),
        metadata_terms: builder.add_text_field("metadata_terms", STRING),
        metadata_json: builder.add_text_field("metadata_json", STORED),
        section_key: builder.add_u64_field("section_key", INDEXED | FAST | STORED),
        sentence_ranges: builder.add_bytes_field("sentence_ranges", STORED),
        sentence_vectors: builder.add_bytes_field("sentence_vectors", STORED),
        section_vector: builder.add_bytes_field("section_vector", STORED),
        section_checksum: builder.add_bytes_field("section_checksum", STORED),
        gap_after: match version {
            SchemaVersion::WithoutGaps => None,
            SchemaVersion::Current => Some(builder.add_text_field("gap_after", STORED)),
        },
    };
    (builder.build(), fields)
}

/// English analysis: split on non-alphanumerics, drop very long tokens, lowercase, fold accents,
/// stem (tantivy's English stemmer, with the stems of words seen before remembered: see
/// [`RememberingStemmer`]). The same analyzer tokenizes queries and, at query time, the chunks
/// being scored.
pub fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(AsciiFoldingFilter)
        .filter(RememberingStemmer)
        .build()
}

pub fn register_analyzer(index: &Index) {
    index.tokenizers().register(ANALYZER, analyzer());
}

/// The term of one metadata pair in `metadata_terms`: written at indexing, asked for by filters.
pub fn metadata_term(key: &str, value: &str) -> String {
    format!("{key}{METADATA_SEPARATOR}{value}")
}
