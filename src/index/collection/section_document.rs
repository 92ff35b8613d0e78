//! A section as a tantivy document, written and read in one place: [`section_documents`] turns a
//! [`DocumentRecord`] into the tantivy documents of its sections (everything stored, with a
//! checksum over all of it, plus the fields that are only indexed), and
//! [`decode_verified_section`] reads tantivy's stored bytes back itself, bounding every length by
//! the bytes at hand and verifying the checksum before [`StoredSection::to_hit`] makes a
//! [`SectionHit`] of them. The schema the fields belong to is in `schema`.

use std::collections::BTreeMap;
use std::ops::Range;

use tantivy::TantivyDocument;

use super::records::{DocumentRecord, SectionHit};
use super::schema::{metadata_term, SectionFields, HEADING_SEPARATOR};
use crate::embed::QuantizedVectors;
use crate::error::{LatheError, Result};

/// The tantivy documents of `document`'s sections, in order: every stored field with its
/// checksum (see [`StoredSection`]), then what is only indexed: the head marker and the document's
/// size on its first section, the title and headings for BM25, the metadata terms for filters.
pub fn section_documents<'d>(
    document: &'d DocumentRecord,
    fields: &'d SectionFields,
) -> Result<impl Iterator<Item = TantivyDocument> + 'd> {
    let metadata_json = serde_json::to_string(&document.metadata)
        .map_err(|e| LatheError::internal(format!("serialising metadata: {e}")))?;
    let heading_separator = HEADING_SEPARATOR.to_string();
    Ok(document.sections.iter().map(move |section| {
        let heading_path = section.heading_path.join(&heading_separator);
        let sentence_ranges = encode_ranges(&section.sentences);
        let mut tantivy_document = StoredSection {
            doc_id: &document.doc_id,
            ordinal: section.ordinal,
            version: document.version,
            doc_title: &document.title,
            heading_path: &heading_path,
            text: &section.text,
            // An index without the field keeps no gaps (its sections are never joined).
            gap_after: if fields.gap_after.is_some() {
                &section.gap_after
            } else {
                ""
            },
            byte_start: section.byte_start,
            char_start: section.char_start,
            metadata_json: &metadata_json,
            section_key: section.section_key,
            sentence_ranges: &sentence_ranges,
            sentence_vectors: &section.sentence_vectors,
            section_vector: &section.section_vector,
        }
        .to_document(fields);
        if section.ordinal == 0 {
            tantivy_document.add_u64(fields.head, 1);
            tantivy_document.add_u64(fields.doc_bytes, document.text_bytes);
        }
        tantivy_document.add_text(
            fields.title_text,
            format!("{} {}", document.title, section.heading_path.join(" ")),
        );
        for (key, value) in &document.metadata {
            tantivy_document.add_text(fields.metadata_terms, metadata_term(key, value));
        }
        tantivy_document
    }))
}

/// Sentence ranges as stored: little-endian u32 start and end per sentence.
pub fn encode_ranges(ranges: &[Range<u32>]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(ranges.len() * 8);
    for range in ranges {
        bytes.extend_from_slice(&range.start.to_le_bytes());
        bytes.extend_from_slice(&range.end.to_le_bytes());
    }
    bytes
}

pub fn decode_ranges(bytes: &[u8]) -> Vec<Range<u32>> {
    bytes
        .chunks_exact(8)
        .map(|pair| {
            let start = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
            let end = u32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
            start..end
        })
        .collect()
}

/// The first row of a stored `QuantizedVectors` blob (a section's vector); `None` for an empty
/// or unreadable one.
pub fn first_vector_row(bytes: &[u8]) -> Option<Vec<f32>> {
    let vectors = QuantizedVectors::from_bytes(bytes).ok()?;
    if vectors.is_empty() {
        return None;
    }
    let mut row = vec![0.0; vectors.dim()];
    vectors.row_into(0, &mut row).ok()?;
    Some(row)
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
    /// Empty when the section has none or the index does not store gaps.
    pub gap_after: &'a str,
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
    /// The gap is hashed last and only when not empty, so a section stored before gaps were
    /// stored verifies as it always did.
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
        if !self.gap_after.is_empty() {
            bytes(self.gap_after.as_bytes());
        }
        let mut checksum = [0u8; CHECKSUM_LEN];
        checksum[0] = CHECKSUM_FORMAT;
        checksum[1..].copy_from_slice(hasher.finalize().as_bytes());
        checksum
    }

    /// A tantivy document holding every stored field of the section and its checksum
    /// ([`section_documents`] adds the fields that are indexed but not stored).
    pub fn to_document(self, fields: &SectionFields) -> TantivyDocument {
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
        // The checksum covers a gap only when it is stored: an index without the field is
        // handed sections without gaps (`section_documents`).
        debug_assert!(fields.gap_after.is_some() || self.gap_after.is_empty());
        if let (Some(field), false) = (fields.gap_after, self.gap_after.is_empty()) {
            document.add_text(field, self.gap_after);
        }
        document
    }

    /// The section as a search result scored `score`, owning its fields.
    pub fn to_hit(self, score: f32) -> Result<SectionHit> {
        let metadata: BTreeMap<String, String> =
            serde_json::from_str(self.metadata_json).map_err(|error| {
                // The checksum matched: this JSON is what the writer serialised.
                LatheError::internal(format!("stored metadata of `{}`: {error}", self.doc_id))
            })?;
        let heading_path = if self.heading_path.is_empty() {
            Vec::new()
        } else {
            self.heading_path
                .split(HEADING_SEPARATOR)
                .map(str::to_string)
                .collect()
        };
        Ok(SectionHit {
            score,
            doc_id: self.doc_id.to_string(),
            ordinal: self.ordinal,
            version: self.version,
            doc_title: self.doc_title.to_string(),
            heading_path,
            text: self.text.to_string(),
            gap_after: self.gap_after.to_string(),
            byte_start: self.byte_start,
            char_start: self.char_start,
            metadata,
            section_key: self.section_key,
            sentences: decode_ranges(self.sentence_ranges),
            sentence_vectors: self.sentence_vectors.to_vec(),
        })
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
const STORED_FIELD_COUNT: usize = 15;

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
    let values = StoredValues::read(bytes, fields)?;
    let section = StoredSection {
        doc_id: values.text(0, "doc_id")?,
        ordinal: values.number(1, "ordinal")?,
        version: values.number(2, "version")?,
        doc_title: values.text(3, "doc_title")?,
        heading_path: values.text(4, "heading_path")?,
        text: values.text(5, "text")?,
        byte_start: values.number(6, "byte_start")?,
        char_start: values.number(7, "char_start")?,
        metadata_json: values.text(8, "metadata_json")?,
        section_key: values.number(9, "section_key")?,
        sentence_ranges: values.optional_bytes(10, "sentence_ranges")?,
        sentence_vectors: values.optional_bytes(11, "sentence_vectors")?,
        section_vector: values.optional_bytes(12, "section_vector")?,
        gap_after: values.optional_text(14, "gap_after")?,
    };
    let stored_checksum = values.optional_bytes(13, "section_checksum")?;
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

/// Decodes and verifies a stored section read for a position whose `section_key` fast field says
/// `expected_key`: intact (its checksum) and the section that belongs there (a damaged block
/// index could hand out another section's bytes, intact but not the ones asked for).
pub fn decode_verified_section<'b>(
    bytes: &'b [u8],
    expected_key: Option<u64>,
    fields: &SectionFields,
) -> std::result::Result<StoredSection<'b>, String> {
    let section = decode_stored_section(bytes, fields).map_err(|damage| damage.to_string())?;
    match expected_key {
        Some(key) if key == section.section_key => Ok(section),
        Some(key) => Err(format!(
            "its stored bytes are those of another section (key {:016x}, not {key:016x})",
            section.section_key
        )),
        None => Err("the `section_key` fast field has no key at its position".to_string()),
    }
}

#[derive(Clone, Copy, Debug)]
enum StoredValue<'a> {
    Text(&'a str),
    U64(u64),
    Bytes(&'a [u8]),
}

/// The stored values of one section, each in its field's slot (see [`stored_slot`]).
struct StoredValues<'a>([Option<StoredValue<'a>>; STORED_FIELD_COUNT]);

impl<'a> StoredValues<'a> {
    /// Every value of `bytes`; refuses unknown fields and type codes, a field stored twice, and
    /// bytes left after the last value.
    fn read(bytes: &'a [u8], fields: &SectionFields) -> Result<Self, SectionDamage> {
        let mut reader = ByteReader { bytes };
        let count = reader.vint()?;
        if count > STORED_FIELD_COUNT as u64 {
            return Err(undecodable(format!(
                "{count} stored values; a section has at most {STORED_FIELD_COUNT}"
            )));
        }
        let mut values = [None; STORED_FIELD_COUNT];
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
        Ok(Self(values))
    }

    fn text(&self, slot: usize, name: &str) -> Result<&'a str, SectionDamage> {
        let Some(StoredValue::Text(text)) = self.0[slot] else {
            return Err(undecodable(format!("`{name}` is missing or not text")));
        };
        Ok(text)
    }

    fn number(&self, slot: usize, name: &str) -> Result<u64, SectionDamage> {
        let Some(StoredValue::U64(number)) = self.0[slot] else {
            return Err(undecodable(format!("`{name}` is missing or not a u64")));
        };
        Ok(number)
    }

    /// Empty when absent: most sections store no gap.
    fn optional_text(&self, slot: usize, name: &str) -> Result<&'a str, SectionDamage> {
        match self.0[slot] {
            Some(StoredValue::Text(text)) => Ok(text),
            None => Ok(""),
            _ => Err(undecodable(format!("`{name}` is not text"))),
        }
    }

    /// Empty when absent: vectors are not stored without the neural stage.
    fn optional_bytes(&self, slot: usize, name: &str) -> Result<&'a [u8], SectionDamage> {
        match self.0[slot] {
            Some(StoredValue::Bytes(bytes)) => Ok(bytes),
            None => Ok(&[][..]),
            _ => Err(undecodable(format!("`{name}` is not bytes"))),
        }
    }
}

/// The slot of a stored field in [`decode_stored_section`]'s table, in schema order.
fn stored_slot(fields: &SectionFields, field_id: u32) -> Option<usize> {
    if fields
        .gap_after
        .is_some_and(|field| field.field_id() == field_id)
    {
        return Some(14);
    }
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
    use super::super::records::SectionRecord;
    use super::super::schema::{
        build_schema, build_schema_version, register_analyzer, SchemaVersion,
    };
    use super::*;
    use tantivy::Index;

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
            gap_after: "",
            byte_start: 4096,
            char_start: 4000,
            metadata_json: r#"{"lang":"en"}"#,
            section_key: u64::MAX - 7,
            sentence_ranges: ranges,
            sentence_vectors: vectors,
            section_vector: vectors,
        }
    }

    /// A RAM index holding `documents`, written and committed through tantivy, in one segment.
    fn written_index(documents: Vec<TantivyDocument>) -> tantivy::Searcher {
        written_index_of(SchemaVersion::Current, documents)
    }

    fn written_index_of(
        version: SchemaVersion,
        documents: Vec<TantivyDocument>,
    ) -> tantivy::Searcher {
        let (schema, _) = build_schema_version(version);
        let index = Index::create_in_ram(schema);
        register_analyzer(&index);
        let mut writer: tantivy::IndexWriter = index.writer(15_000_000).unwrap();
        for document in documents {
            writer.add_document(document).unwrap();
        }
        writer.commit().unwrap();
        index.reader().unwrap().searcher()
    }

    /// Writes `documents` into a RAM index through tantivy and returns each one's stored bytes
    /// as tantivy's doc store hands them out.
    fn stored_bytes(documents: Vec<TantivyDocument>) -> Vec<Vec<u8>> {
        stored_bytes_of(SchemaVersion::Current, documents)
    }

    fn stored_bytes_of(version: SchemaVersion, documents: Vec<TantivyDocument>) -> Vec<Vec<u8>> {
        let count = documents.len();
        let searcher = written_index_of(version, documents);
        let store = searcher.segment_reader(0).get_store_reader(0).unwrap();
        (0..count as u32)
            .map(|doc| store.get_document_bytes(doc).unwrap().as_slice().to_vec())
            .collect()
    }

    /// Two sections: a head section without headings or vectors, and one with both.
    fn record() -> DocumentRecord {
        let section =
            |ordinal: u64, headings: &[&str], text: &str, vector: Vec<u8>| SectionRecord {
                ordinal,
                heading_path: headings.iter().map(|h| h.to_string()).collect(),
                text: text.to_string(),
                gap_after: String::new(),
                byte_start: 100 * ordinal,
                char_start: 90 * ordinal,
                section_key: 1000 + ordinal,
                sentences: vec![0..7, 8..text.len() as u32],
                sentence_vectors: vector.repeat(2),
                section_vector: vector,
            };
        DocumentRecord {
            doc_id: "Super_Bowl_50".into(),
            title: "Super Bowl 50".into(),
            metadata: BTreeMap::from([
                ("lang".to_string(), "en".to_string()),
                ("year".to_string(), "2016".to_string()),
            ]),
            text_bytes: 9000,
            version: 7,
            sections: vec![
                section(0, &[], "kickoff in Santa Clara", Vec::new()),
                section(
                    1,
                    &["Game", "Scoring"],
                    "hazards in their line, ünïcode",
                    vec![4, 5],
                ),
            ],
        }
    }

    #[test]
    fn a_written_section_document_reads_back_every_field() {
        let (_, fields) = build_schema();
        let document = record();
        let written = section_documents(&document, &fields).unwrap().collect();
        let bytes = stored_bytes(written);
        assert_eq!(bytes.len(), document.sections.len());
        for (section, stored) in document.sections.iter().zip(&bytes) {
            let decoded = decode_verified_section(stored, Some(section.section_key), &fields);
            let decoded = decoded.unwrap();
            assert_eq!(decoded.section_vector, section.section_vector.as_slice());
            let expected = SectionHit {
                score: 0.5,
                doc_id: document.doc_id.clone(),
                ordinal: section.ordinal,
                version: document.version,
                doc_title: document.title.clone(),
                heading_path: section.heading_path.clone(),
                text: section.text.clone(),
                gap_after: section.gap_after.clone(),
                byte_start: section.byte_start,
                char_start: section.char_start,
                metadata: document.metadata.clone(),
                section_key: section.section_key,
                sentences: section.sentences.clone(),
                sentence_vectors: section.sentence_vectors.clone(),
            };
            assert_eq!(decoded.to_hit(0.5).unwrap(), expected);
        }
        // Bytes read for a position that holds another section are refused.
        let error = decode_verified_section(&bytes[0], Some(1001), &fields).unwrap_err();
        assert!(error.contains("those of another section"), "{error}");
        assert!(decode_verified_section(&bytes[0], None, &fields).is_err());
    }

    /// A gap is stored, covered by the checksum and read back; an index of the schema before
    /// gaps stores none and its sections verify as they always did.
    #[test]
    fn gaps_are_stored_where_the_schema_has_them_and_verified() {
        let mut document = record();
        document.sections[0].gap_after = "\n\n".into();
        let (_, fields) = build_schema();
        let bytes = stored_bytes(section_documents(&document, &fields).unwrap().collect());
        let read = |bytes: &[u8], fields: &SectionFields, key| {
            let section = decode_verified_section(bytes, Some(key), fields).unwrap();
            section.to_hit(1.0).unwrap().gap_after
        };
        assert_eq!(read(&bytes[0], &fields, 1000), "\n\n");
        assert_eq!(read(&bytes[1], &fields, 1001), "");
        // The gap is under the checksum: another gap is damage.
        let mut altered = bytes[0].clone();
        let at = altered.windows(2).rposition(|w| w == b"\n\n").unwrap();
        altered[at] = b' ';
        let error = decode_verified_section(&altered, Some(1000), &fields).unwrap_err();
        assert!(error.contains("fails its checksum"), "{error}");

        let (_, old_fields) = build_schema_version(SchemaVersion::WithoutGaps);
        assert_eq!(old_fields.gap_after, None);
        let written: Vec<_> = section_documents(&document, &old_fields).unwrap().collect();
        let old_bytes = stored_bytes_of(SchemaVersion::WithoutGaps, written);
        assert_eq!(
            read(&old_bytes[0], &old_fields, 1000),
            "",
            "no field, no gap"
        );
        // Without a gap a section's checksum is the one written before gaps were stored, so
        // the sections of older indexes verify under today's fields too.
        document.sections[0].gap_after.clear();
        let today = stored_bytes(section_documents(&document, &fields).unwrap().collect());
        assert_eq!(today[0], old_bytes[0]);
        assert_eq!(read(&old_bytes[0], &fields, 1000), "");
    }

    #[test]
    fn the_indexed_only_fields_are_written_where_queries_look() {
        use tantivy::collector::Count;
        use tantivy::query::TermQuery;
        use tantivy::schema::IndexRecordOption;
        use tantivy::Term;
        let (_, fields) = build_schema();
        let document = record();
        let searcher = written_index(section_documents(&document, &fields).unwrap().collect());
        let count = |term: Term| {
            let query = TermQuery::new(term, IndexRecordOption::Basic);
            searcher.search(&query, &Count).unwrap()
        };
        // One head per document (documents are counted by it), on its first section.
        assert_eq!(count(Term::from_field_u64(fields.head, 1)), 1);
        let head_bytes = searcher.segment_reader(0).fast_fields().u64("doc_bytes");
        assert_eq!(head_bytes.unwrap().first(0), Some(9000));
        let metadata =
            |key, value| Term::from_field_text(fields.metadata_terms, &metadata_term(key, value));
        assert_eq!(count(metadata("lang", "en")), 2);
        assert_eq!(count(metadata("year", "2016")), 2);
        assert_eq!(count(metadata("lang", "fr")), 0);
        // Title and headings, analysed ("Scoring" is stemmed); the section text is not in there.
        assert_eq!(count(Term::from_field_text(fields.title_text, "bowl")), 2);
        assert_eq!(count(Term::from_field_text(fields.title_text, "score")), 1);
        assert_eq!(count(Term::from_field_text(fields.title_text, "hazard")), 0);
        assert_eq!(count(Term::from_field_text(fields.text, "hazard")), 1);
        assert_eq!(
            count(Term::from_field_text(fields.doc_id, "Super_Bowl_50")),
            2
        );
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
            StoredSection {
                gap_after: " ",
                ..original
            },
            // The same bytes moved from the section vector to the gap.
            StoredSection {
                section_vector: &[1],
                gap_after: "\u{2}",
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
