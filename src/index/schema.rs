//! The tantivy schema of a collection: one tantivy document per section, with everything that
//! query-time re-chunking needs stored beside the BM25-indexed text, and how a section is stored
//! and read back: [`StoredSection`] is written with a checksum over all of it, and
//! [`decode_stored_section`] reads tantivy's stored bytes itself, bounding every length by the
//! bytes at hand, and verifies that checksum before anything is returned.

use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions, FAST,
    INDEXED, STORED, STRING,
};
use tantivy::tokenizer::{
    AsciiFoldingFilter, Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer,
    TextAnalyzer,
};
use tantivy::{Index, TantivyDocument};

/// Name of the analyzer of section text and titles.
pub const ANALYZER: &str = "lathe_en";

/// Separator of a metadata term `key\u{1f}value`: defined with the domain types, where the edge
/// checks metadata keys against it.
pub use crate::types::METADATA_SEPARATOR;

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
    /// [`StoredSection::checksum`] of every other stored field of the section.
    pub section_checksum: Field,
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

/// Version byte in front of the stored checksum: a later change of what the checksum covers gets
/// a new version instead of reading as damage.
const CHECKSUM_FORMAT: u8 = 1;
/// The stored checksum: the format byte, then a BLAKE3 hash.
pub const CHECKSUM_LEN: usize = 1 + blake3::OUT_LEN;
/// Domain of the BLAKE3 hash (`derive_key` context), so that no other hash in Lathe can collide.
const CHECKSUM_CONTEXT: &str = "lathe 2026-11 stored section v1";

/// Everything stored for one section: what a read returns, and what its checksum covers.
/// Borrowed from the caller when writing and from tantivy's stored bytes when reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredSection<'a> {
    pub doc_id: &'a str,
    pub ordinal: u64,
    pub version: u64,
    pub doc_title: &'a str,
    /// The heading path joined by [`HEADING_SEPARATOR`].
    pub heading_path: &'a str,
    pub text: &'a str,
    pub byte_start: u64,
    pub char_start: u64,
    pub metadata_json: &'a str,
    pub section_key: u64,
    /// [`encode_ranges`] bytes.
    pub sentence_ranges: &'a [u8],
    /// Empty without the neural stage.
    pub sentence_vectors: &'a [u8],
    /// Empty without the neural stage.
    pub section_vector: &'a [u8],
}

impl StoredSection<'_> {
    /// The format byte and a BLAKE3 hash of every field, each length-prefixed, in a fixed order.
    pub fn checksum(&self) -> [u8; CHECKSUM_LEN] {
        let mut hasher = blake3::Hasher::new_derive_key(CHECKSUM_CONTEXT);
        let mut bytes = |value: &[u8]| {
            hasher.update(&(value.len() as u64).to_le_bytes());
            hasher.update(value);
        };
        bytes(self.doc_id.as_bytes());
        bytes(&self.ordinal.to_le_bytes());
        bytes(&self.version.to_le_bytes());
        bytes(self.doc_title.as_bytes());
        bytes(self.heading_path.as_bytes());
        bytes(self.text.as_bytes());
        bytes(&self.byte_start.to_le_bytes());
        bytes(&self.char_start.to_le_bytes());
        bytes(self.metadata_json.as_bytes());
        bytes(&self.section_key.to_le_bytes());
        bytes(self.sentence_ranges);
        bytes(self.sentence_vectors);
        bytes(self.section_vector);
        let mut checksum = [0u8; CHECKSUM_LEN];
        checksum[0] = CHECKSUM_FORMAT;
        checksum[1..].copy_from_slice(hasher.finalize().as_bytes());
        checksum
    }

    /// A tantivy document holding every stored field of the section and its checksum. The
    /// caller adds the fields that are indexed but not stored.
    pub fn to_document(&self, fields: &SectionFields) -> TantivyDocument {
        let mut document = TantivyDocument::default();
        document.add_text(fields.doc_id, self.doc_id);
        document.add_u64(fields.ordinal, self.ordinal);
        document.add_u64(fields.version, self.version);
        document.add_text(fields.doc_title, self.doc_title);
        document.add_text(fields.heading_path, self.heading_path);
        document.add_text(fields.text, self.text);
        document.add_u64(fields.byte_start, self.byte_start);
        document.add_u64(fields.char_start, self.char_start);
        document.add_text(fields.metadata_json, self.metadata_json);
        document.add_u64(fields.section_key, self.section_key);
        document.add_bytes(fields.sentence_ranges, self.sentence_ranges);
        if !self.sentence_vectors.is_empty() {
            document.add_bytes(fields.sentence_vectors, self.sentence_vectors);
        }
        if !self.section_vector.is_empty() {
            document.add_bytes(fields.section_vector, self.section_vector);
        }
        document.add_bytes(fields.section_checksum, &self.checksum()[..]);
        document
    }
}

/// Why stored section bytes were not returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SectionDamage {
    /// The bytes are not a section as Lathe stores it (a length past the end, an unknown field,
    /// a wrong value type, invalid UTF-8, a missing field, ...).
    #[error("its stored section does not decode ({0})")]
    Undecodable(String),
    /// The section decodes but its fields are not the ones its checksum was computed over.
    #[error("its stored section fails its checksum")]
    ChecksumMismatch,
}

fn undecodable(reason: impl Into<String>) -> SectionDamage {
    SectionDamage::Undecodable(reason.into())
}

/// tantivy's type codes of stored values (`tantivy::schema::document::type_codes`, private there;
/// `the_stored_format_is_the_one_tantivy_writes` checks them).
const TEXT_CODE: u8 = 0;
const U64_CODE: u8 = 1;
const BYTES_CODE: u8 = 4;

/// Stored fields per section: at most one value each.
const STORED_FIELD_COUNT: usize = 14;

/// Reads one section from the bytes tantivy's doc store holds for it (`StoreReader::
/// get_document_bytes`: a VInt count, then per value its field id as a little-endian u32, a type
/// code, and the value: a VInt length and the bytes for text and bytes, 8 little-endian bytes for
/// a u64), then verifies its checksum.
///
/// Unlike tantivy's own decoder, which reserves whatever length a VInt says before reading (a
/// damaged length once asked for 21 PB and aborted the process), every length here is checked
/// against the bytes at hand and the values are borrowed, not copied: damaged bytes give an
/// error, never an allocation or a panic.
pub fn decode_stored_section<'a>(
    bytes: &'a [u8],
    fields: &SectionFields,
) -> Result<StoredSection<'a>, SectionDamage> {
    let mut reader = ByteReader { bytes };
    let count = reader.vint()?;
    if count > STORED_FIELD_COUNT as u64 {
        return Err(undecodable(format!(
            "{count} stored values; a section has at most {STORED_FIELD_COUNT}"
        )));
    }
    let mut values: [Option<StoredValue<'a>>; STORED_FIELD_COUNT] = [None; STORED_FIELD_COUNT];
    for _ in 0..count {
        let field_id = reader.u32()?;
        let slot = stored_slot(fields, field_id)
            .ok_or_else(|| undecodable(format!("unknown stored field {field_id}")))?;
        let value = match reader.u8()? {
            TEXT_CODE => {
                let bytes = reader.length_prefixed()?;
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| undecodable(format!("field {field_id} is not UTF-8")))?;
                StoredValue::Text(text)
            }
            U64_CODE => StoredValue::U64(reader.u64()?),
            BYTES_CODE => StoredValue::Bytes(reader.length_prefixed()?),
            code => {
                return Err(undecodable(format!(
                    "field {field_id} has value type code {code}"
                )))
            }
        };
        if values[slot].replace(value).is_some() {
            return Err(undecodable(format!("field {field_id} is stored twice")));
        }
    }
    if !reader.bytes.is_empty() {
        return Err(undecodable(format!(
            "{} bytes after the last value",
            reader.bytes.len()
        )));
    }
    let text = |slot: usize, name: &str| match values[slot] {
        Some(StoredValue::Text(text)) => Ok(text),
        _ => Err(undecodable(format!("`{name}` is missing or not text"))),
    };
    let number = |slot: usize, name: &str| match values[slot] {
        Some(StoredValue::U64(number)) => Ok(number),
        _ => Err(undecodable(format!("`{name}` is missing or not a u64"))),
    };
    let optional_bytes = |slot: usize, name: &str| match values[slot] {
        Some(StoredValue::Bytes(bytes)) => Ok(bytes),
        None => Ok(&[][..]),
        _ => Err(undecodable(format!("`{name}` is not bytes"))),
    };
    let section = StoredSection {
        doc_id: text(0, "doc_id")?,
        ordinal: number(1, "ordinal")?,
        version: number(2, "version")?,
        doc_title: text(3, "doc_title")?,
        heading_path: text(4, "heading_path")?,
        text: text(5, "text")?,
        byte_start: number(6, "byte_start")?,
        char_start: number(7, "char_start")?,
        metadata_json: text(8, "metadata_json")?,
        section_key: number(9, "section_key")?,
        sentence_ranges: optional_bytes(10, "sentence_ranges")?,
        sentence_vectors: optional_bytes(11, "sentence_vectors")?,
        section_vector: optional_bytes(12, "section_vector")?,
    };
    let stored_checksum = optional_bytes(13, "section_checksum")?;
    if stored_checksum.len() != CHECKSUM_LEN || stored_checksum[0] != CHECKSUM_FORMAT {
        return Err(undecodable(
            "`section_checksum` is missing or of an unknown format",
        ));
    }
    if stored_checksum != section.checksum() {
        return Err(SectionDamage::ChecksumMismatch);
    }
    Ok(section)
}

#[derive(Clone, Copy, Debug)]
enum StoredValue<'a> {
    Text(&'a str),
    U64(u64),
    Bytes(&'a [u8]),
}

/// The slot of a stored field in [`decode_stored_section`]'s table, in [`StoredSection`] order.
fn stored_slot(fields: &SectionFields, field_id: u32) -> Option<usize> {
    [
        fields.doc_id,
        fields.ordinal,
        fields.version,
        fields.doc_title,
        fields.heading_path,
        fields.text,
        fields.byte_start,
        fields.char_start,
        fields.metadata_json,
        fields.section_key,
        fields.sentence_ranges,
        fields.sentence_vectors,
        fields.section_vector,
        fields.section_checksum,
    ]
    .iter()
    .position(|field| field.field_id() == field_id)
}

/// Reads from the front of a byte slice; every read checks the length first.
struct ByteReader<'a> {
    bytes: &'a [u8],
}

impl<'a> ByteReader<'a> {
    fn take(&mut self, length: usize) -> Result<&'a [u8], SectionDamage> {
        if length > self.bytes.len() {
            return Err(undecodable(format!(
                "a value of {length} bytes with {} bytes left",
                self.bytes.len()
            )));
        }
        let (taken, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, SectionDamage> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, SectionDamage> {
        let mut le = [0u8; 4];
        le.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(le))
    }

    fn u64(&mut self) -> Result<u64, SectionDamage> {
        let mut le = [0u8; 8];
        le.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(le))
    }

    /// tantivy's VInt: 7 bits per byte, least significant first, the last byte's high bit set.
    fn vint(&mut self) -> Result<u64, SectionDamage> {
        let mut value = 0u64;
        for position in 0..10 {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte holds bit 63 only.
            if position == 9 && bits > 1 {
                return Err(undecodable("a VInt longer than 64 bits"));
            }
            value |= bits << (7 * position);
            if byte & 0x80 != 0 {
                return Ok(value);
            }
        }
        Err(undecodable("a VInt longer than 10 bytes"))
    }

    fn length_prefixed(&mut self) -> Result<&'a [u8], SectionDamage> {
        let length = self.vint()?;
        // A length past the bytes at hand is refused before anything is reserved.
        let length = usize::try_from(length).unwrap_or(usize::MAX);
        self.take(length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentence_ranges_roundtrip() {
        let ranges = vec![0..5, 6..17, 18..18];
        assert_eq!(super::decode_ranges(&super::encode_ranges(&ranges)), ranges);
    }

    fn section<'a>(ranges: &'a [u8], vectors: &'a [u8]) -> StoredSection<'a> {
        StoredSection {
            doc_id: "Super_Bowl_50",
            ordinal: 3,
            version: 0x1234_5678_9abc_def0,
            doc_title: "Super Bowl 50",
            heading_path: "Game\u{1e}Scoring",
            text: "hazards in their line, ünïcode and all",
            byte_start: 4096,
            char_start: 4000,
            metadata_json: r#"{"lang":"en"}"#,
            section_key: u64::MAX - 7,
            sentence_ranges: ranges,
            sentence_vectors: vectors,
            section_vector: vectors,
        }
    }

    /// Writes `documents` into a RAM index through tantivy and returns each one's stored bytes
    /// as tantivy's doc store hands them out.
    fn stored_bytes(documents: Vec<TantivyDocument>) -> Vec<Vec<u8>> {
        let (schema, _) = build_schema();
        let index = Index::create_in_ram(schema);
        register_analyzer(&index);
        let mut writer: tantivy::IndexWriter = index.writer(15_000_000).unwrap();
        let count = documents.len();
        for document in documents {
            writer.add_document(document).unwrap();
        }
        writer.commit().unwrap();
        let searcher = index.reader().unwrap().searcher();
        let store = searcher.segment_reader(0).get_store_reader(0).unwrap();
        (0..count as u32)
            .map(|doc| store.get_document_bytes(doc).unwrap().as_slice().to_vec())
            .collect()
    }

    #[test]
    fn the_stored_format_is_the_one_tantivy_writes() {
        let (_, fields) = build_schema();
        let ranges = encode_ranges(&[0..7, 8..21]);
        let vectors = [9u8, 8, 7, 6, 5];
        let with_vectors = section(&ranges, &vectors);
        let lexical = section(&ranges, &[]);
        let bytes = stored_bytes(vec![
            with_vectors.to_document(&fields),
            lexical.to_document(&fields),
        ]);
        assert_eq!(decode_stored_section(&bytes[0], &fields), Ok(with_vectors));
        assert_eq!(decode_stored_section(&bytes[1], &fields), Ok(lexical));
    }

    #[test]
    fn every_flipped_bit_of_a_stored_section_is_refused() {
        let (_, fields) = build_schema();
        let ranges = encode_ranges(&[0..7, 8..21]);
        let vectors = [1u8, 2, 3];
        let bytes = stored_bytes(vec![section(&ranges, &vectors).to_document(&fields)]).remove(0);
        let mut checksum_mismatches = 0;
        for position in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[position] ^= 1 << bit;
                match decode_stored_section(&damaged, &fields) {
                    Ok(decoded) => panic!("flipped bit {bit} of byte {position} read {decoded:?}"),
                    Err(SectionDamage::ChecksumMismatch) => checksum_mismatches += 1,
                    Err(SectionDamage::Undecodable(_)) => {}
                }
            }
        }
        // Most flips land in the text and are caught by the checksum, not the decoder.
        assert!(
            checksum_mismatches > bytes.len() * 4,
            "{checksum_mismatches}"
        );
    }

    #[test]
    fn a_length_past_the_end_is_refused_before_anything_is_reserved() {
        let (_, fields) = build_schema();
        // One text value of 2^60 bytes (the kind of length that made tantivy ask for 21 PB).
        let mut bytes = vec![0x81];
        bytes.extend_from_slice(&fields.text.field_id().to_le_bytes());
        bytes.push(TEXT_CODE);
        bytes.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0x90]);
        bytes.extend_from_slice(b"hazards");
        let error = decode_stored_section(&bytes, &fields).unwrap_err();
        assert_eq!(
            error,
            SectionDamage::Undecodable(
                "a value of 1152921504606846976 bytes with 7 bytes left".into()
            )
        );
        // A VInt that does not fit 64 bits, and one that never ends.
        assert!(decode_stored_section(&[0xff; 11], &fields).is_err());
        assert!(decode_stored_section(&[0x7f; 3], &fields).is_err());
    }

    #[test]
    fn the_checksum_covers_every_field_and_its_boundaries() {
        let ranges = encode_ranges(&[0..7, 8..21]);
        let vectors = [1u8, 2];
        let original = section(&ranges, &vectors);
        let changed = [
            StoredSection {
                doc_id: "Super_Bowl_51",
                ..original
            },
            StoredSection {
                ordinal: 4,
                ..original
            },
            StoredSection {
                version: 1,
                ..original
            },
            StoredSection {
                doc_title: "Super Bowl 5",
                ..original
            },
            // The same bytes split differently between two fields.
            StoredSection {
                doc_title: "Super Bowl 50Game",
                heading_path: "\u{1e}Scoring",
                ..original
            },
            StoredSection {
                heading_path: "Game",
                ..original
            },
            StoredSection {
                text: "hazardly letheir line, ünïcode and all",
                ..original
            },
            StoredSection {
                byte_start: 4097,
                ..original
            },
            StoredSection {
                char_start: 3999,
                ..original
            },
            StoredSection {
                metadata_json: r#"{"lang":"fr"}"#,
                ..original
            },
            StoredSection {
                section_key: 0,
                ..original
            },
            StoredSection {
                sentence_ranges: &[],
                ..original
            },
            StoredSection {
                sentence_vectors: &[1, 3],
                ..original
            },
            StoredSection {
                section_vector: &[],
                ..original
            },
        ];
        for other in changed {
            assert_ne!(other.checksum(), original.checksum(), "{other:?}");
        }
        assert_eq!(original.checksum(), section(&ranges, &vectors).checksum());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_stored_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let (_, fields) = build_schema();
            proptest::prop_assert!(decode_stored_section(&bytes, &fields).is_err());
        }
    }
}
