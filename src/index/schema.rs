//! The tantivy schema of a collection: one tantivy document per section, with everything that
//! query-time re-chunking needs stored beside the BM25-indexed text.

use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions, FAST,
    INDEXED, STORED, STRING,
};
use tantivy::tokenizer::{
    AsciiFoldingFilter, Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer,
    TextAnalyzer,
};
use tantivy::Index;

/// Name of the analyzer of section text and titles.
pub const ANALYZER: &str = "lathe_en";

/// Separator of a metadata term `key\u{1f}value` (ASCII unit separator: never typed by users).
pub const METADATA_SEPARATOR: char = '\u{1f}';

#[derive(Clone, Copy, Debug)]
pub struct SectionFields {
    /// The document id: indexed raw, for deletes and `doc_ids` filters.
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
}

pub const HEADING_SEPARATOR: char = '\u{1e}';

pub fn build_schema() -> (Schema, SectionFields) {
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
        doc_id: builder.add_text_field("doc_id", STRING | STORED),
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
    };
    (builder.build(), fields)
}

/// English analysis: split on non-alphanumerics, drop very long tokens, lowercase, fold accents,
/// stem. The same analyzer tokenizes queries and, at query time, the chunks being scored.
pub fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(AsciiFoldingFilter)
        .filter(Stemmer::new(Language::English))
        .build()
}

pub fn register_analyzer(index: &Index) {
    index.tokenizers().register(ANALYZER, analyzer());
}

/// Sentence ranges as stored: little-endian u32 start and end per sentence.
pub fn encode_ranges(ranges: &[std::ops::Range<u32>]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(ranges.len() * 8);
    for range in ranges {
        bytes.extend_from_slice(&range.start.to_le_bytes());
        bytes.extend_from_slice(&range.end.to_le_bytes());
    }
    bytes
}

pub fn decode_ranges(bytes: &[u8]) -> Vec<std::ops::Range<u32>> {
    bytes
        .chunks_exact(8)
        .map(|pair| {
            let start = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
            let end = u32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
            start..end
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sentence_ranges_roundtrip() {
        let ranges = vec![0..5, 6..17, 18..18];
        assert_eq!(super::decode_ranges(&super::encode_ranges(&ranges)), ranges);
    }
}
