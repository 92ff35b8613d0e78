//! Log entries ⇄ domain types: what a replica publishes and what it applies. Encoding takes the
//! records by value (their strings move into the message); decoding checks everything a replica
//! would otherwise trust — sentence ranges inside their text and on char boundaries, section
//! keys that derive from the version, vector rows that match the sentences and the model — so a
//! malformed entry stops the apply loop instead of reaching an index.

use std::ops::Range;

use prost::Message;

use super::proto;
use crate::embed::QuantizedVectors;
use crate::index::{
    is_valid_collection_name, section_key, DocumentRecord, SectionRecord, StoredSettings,
    MAX_GAP_BYTES,
};

/// The model that made a version's vectors: every replica must run the same one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VectorStamp {
    /// "minilm" or "static"; empty without vectors.
    pub model: String,
    /// 0 without vectors.
    pub dim: u32,
}

/// One decoded log entry.
#[derive(Clone, Debug)]
pub enum Entry {
    CollectionCreated {
        name: String,
        settings: StoredSettings,
    },
    CollectionDeleted {
        name: String,
    },
    Upsert {
        collection: String,
        record: DocumentRecord,
        vectors: VectorStamp,
    },
    Delete {
        collection: String,
        doc_id: String,
    },
    /// An alias made or switched to name `collection`.
    AliasSet {
        alias: String,
        collection: String,
    },
    AliasDeleted {
        alias: String,
    },
}

impl Entry {
    /// The collection the entry is about (for an alias entry, the alias).
    pub fn collection(&self) -> &str {
        match self {
            Entry::CollectionCreated { name, .. } | Entry::CollectionDeleted { name } => name,
            Entry::Upsert { collection, .. } | Entry::Delete { collection, .. } => collection,
            Entry::AliasSet { alias, .. } | Entry::AliasDeleted { alias } => alias,
        }
    }
}

/// One document's encoded entry, ready to publish.
pub struct EncodedDocument {
    pub doc_id: String,
    pub bytes: Vec<u8>,
}

/// A log entry that cannot be applied: the apply loop stops on it (never skips it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

fn malformed(message: impl Into<String>) -> Malformed {
    Malformed(message.into())
}

/// The parts of an oversized version, as its `DocumentParts` entry names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartsRef {
    pub collection: String,
    pub doc_id: String,
    pub sequences: Vec<u64>,
    pub total_bytes: u64,
    pub blake3: [u8; 32],
}

/// What a message on a log subject holds: an entry, or the reference to a split one.
#[derive(Debug)]
pub enum Decoded {
    Entry(Entry),
    Parts(PartsRef),
}

pub fn encode(entry: Entry) -> Vec<u8> {
    let entry = match entry {
        Entry::CollectionCreated { name, settings } => {
            proto::log_entry::Entry::CollectionCreated(proto::CollectionCreated {
                name,
                budget_tokenizer: settings.budget_tokenizer,
                section_tokens: settings.section_tokens,
                default_strategy: settings.default_strategy,
                default_max_tokens: settings.default_max_tokens,
                default_overlap_tokens: settings.default_overlap_tokens,
            })
        }
        Entry::CollectionDeleted { name } => {
            proto::log_entry::Entry::CollectionDeleted(proto::CollectionDeleted { name })
        }
        Entry::Upsert {
            collection,
            record,
            vectors,
        } => proto::log_entry::Entry::Document(version_to_proto(collection, record, vectors)),
        Entry::Delete { collection, doc_id } => {
            proto::log_entry::Entry::DocumentDeleted(proto::DocumentDeleted { collection, doc_id })
        }
        Entry::AliasSet { alias, collection } => {
            proto::log_entry::Entry::AliasSet(proto::AliasSet { alias, collection })
        }
        Entry::AliasDeleted { alias } => {
            proto::log_entry::Entry::AliasDeleted(proto::AliasDeleted { alias })
        }
    };
    proto::LogEntry { entry: Some(entry) }.encode_to_vec()
}

pub fn encode_parts(parts: PartsRef) -> Vec<u8> {
    let PartsRef {
        collection,
        doc_id,
        sequences,
        total_bytes,
        blake3,
    } = parts;
    let entry = proto::log_entry::Entry::DocumentParts(proto::DocumentParts {
        collection,
        doc_id,
        part_sequences: sequences,
        total_bytes,
        blake3: blake3.to_vec(),
    });
    proto::LogEntry { entry: Some(entry) }.encode_to_vec()
}

fn version_to_proto(
    collection: String,
    record: DocumentRecord,
    vectors: VectorStamp,
) -> proto::DocumentVersion {
    let DocumentRecord {
        doc_id,
        title,
        metadata,
        text_bytes,
        version,
        sections,
    } = record;
    let sections = sections
        .into_iter()
        .map(|section| {
            let SectionRecord {
                ordinal,
                heading_path,
                text,
                gap_after,
                byte_start,
                char_start,
                section_key,
                sentences,
                sentence_vectors,
                section_vector,
            } = section;
            proto::Section {
                ordinal,
                heading_path,
                text,
                gap_after,
                byte_start,
                char_start,
                section_key,
                sentence_bounds: sentences.iter().flat_map(|r| [r.start, r.end]).collect(),
                sentence_vectors,
                section_vector,
            }
        })
        .collect();
    proto::DocumentVersion {
        collection,
        doc_id,
        title,
        metadata: metadata.into_iter().collect(),
        text_bytes,
        version,
        sections,
        model: vectors.model,
        vector_dim: vectors.dim,
    }
}

/// Decodes and checks one message of a log subject.
pub fn decode(bytes: &[u8]) -> Result<Decoded, Malformed> {
    let entry = proto::LogEntry::decode(bytes)
        .map_err(|error| malformed(format!("not a log entry: {error}")))?;
    let entry = entry.entry.ok_or_else(|| {
        malformed("an entry of a kind this Lathe does not know (written by a newer Lathe?)")
    })?;
    Ok(match entry {
        proto::log_entry::Entry::CollectionCreated(created) => {
            Decoded::Entry(Entry::CollectionCreated {
                settings: StoredSettings {
                    budget_tokenizer: created.budget_tokenizer,
                    section_tokens: created.section_tokens,
                    default_strategy: created.default_strategy,
                    default_max_tokens: created.default_max_tokens,
                    default_overlap_tokens: created.default_overlap_tokens,
                    log_created: None,
                },
                name: created.name,
            })
        }
        proto::log_entry::Entry::CollectionDeleted(deleted) => {
            Decoded::Entry(Entry::CollectionDeleted { name: deleted.name })
        }
        proto::log_entry::Entry::Document(version) => Decoded::Entry(version_from_proto(version)?),
        proto::log_entry::Entry::DocumentDeleted(deleted) => Decoded::Entry(Entry::Delete {
            collection: deleted.collection,
            doc_id: deleted.doc_id,
        }),
        proto::log_entry::Entry::DocumentParts(parts) => Decoded::Parts(parts_from_proto(parts)?),
        proto::log_entry::Entry::AliasSet(set) => {
            check_alias_names(&[&set.alias, &set.collection])?;
            Decoded::Entry(Entry::AliasSet {
                alias: set.alias,
                collection: set.collection,
            })
        }
        proto::log_entry::Entry::AliasDeleted(deleted) => {
            check_alias_names(&[&deleted.alias])?;
            Decoded::Entry(Entry::AliasDeleted {
                alias: deleted.alias,
            })
        }
    })
}

/// An alias entry names an alias and a collection by the collection name rule.
fn check_alias_names(names: &[&str]) -> Result<(), Malformed> {
    match names.iter().find(|name| !is_valid_collection_name(name)) {
        Some(name) => Err(malformed(format!(
            "an alias entry naming `{name}`, which is not a valid name"
        ))),
        None => Ok(()),
    }
}

fn parts_from_proto(parts: proto::DocumentParts) -> Result<PartsRef, Malformed> {
    let blake3: [u8; 32] = parts
        .blake3
        .as_slice()
        .try_into()
        .map_err(|_| malformed("a parts entry without a 32-byte BLAKE3 hash"))?;
    if parts.part_sequences.is_empty() {
        return Err(malformed("a parts entry that names no part"));
    }
    Ok(PartsRef {
        collection: parts.collection,
        doc_id: parts.doc_id,
        sequences: parts.part_sequences,
        total_bytes: parts.total_bytes,
        blake3,
    })
}

fn version_from_proto(version: proto::DocumentVersion) -> Result<Entry, Malformed> {
    let proto::DocumentVersion {
        collection,
        doc_id,
        title,
        metadata,
        text_bytes,
        version,
        sections,
        model,
        vector_dim,
    } = version;
    if doc_id.is_empty() {
        return Err(malformed("a document version without an id"));
    }
    let sections = sections
        .into_iter()
        .map(|section| section_from_proto(&doc_id, version, vector_dim, section))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Entry::Upsert {
        collection,
        record: DocumentRecord {
            doc_id,
            title,
            metadata: metadata.into_iter().collect(),
            text_bytes,
            version,
            sections,
        },
        vectors: VectorStamp {
            model,
            dim: vector_dim,
        },
    })
}

fn section_from_proto(
    doc_id: &str,
    version: u64,
    vector_dim: u32,
    section: proto::Section,
) -> Result<SectionRecord, Malformed> {
    let proto::Section {
        ordinal,
        heading_path,
        text,
        gap_after,
        byte_start,
        char_start,
        section_key: key,
        sentence_bounds,
        sentence_vectors,
        section_vector,
    } = section;
    let at = || format!("document `{doc_id}` section {ordinal}");
    if key != section_key(doc_id, ordinal, version) {
        return Err(malformed(format!(
            "{}: its key does not derive from the version",
            at()
        )));
    }
    let sentences = sentence_ranges(&text, &sentence_bounds)
        .map_err(|why| malformed(format!("{}: {why}", at())))?;
    if gap_after.len() > MAX_GAP_BYTES || !gap_after.chars().all(char::is_whitespace) {
        return Err(malformed(format!(
            "{}: the gap after it is not whitespace of at most {MAX_GAP_BYTES} bytes",
            at()
        )));
    }
    check_vectors(
        vector_dim,
        sentences.len(),
        &sentence_vectors,
        &section_vector,
    )
    .map_err(|why| malformed(format!("{}: {why}", at())))?;
    Ok(SectionRecord {
        ordinal,
        heading_path,
        text,
        gap_after,
        byte_start,
        char_start,
        section_key: key,
        sentences,
        sentence_vectors,
        section_vector,
    })
}

/// Start, end pairs as ranges, each inside `text` and on char boundaries.
fn sentence_ranges(text: &str, bounds: &[u32]) -> Result<Vec<Range<u32>>, String> {
    if !bounds.len().is_multiple_of(2) {
        return Err("an odd number of sentence bounds".into());
    }
    bounds
        .chunks_exact(2)
        .map(|pair| {
            let (start, end) = (pair[0], pair[1]);
            let fits = start <= end
                && (end as usize) <= text.len()
                && text.is_char_boundary(start as usize)
                && text.is_char_boundary(end as usize);
            if fits {
                Ok(start..end)
            } else {
                Err(format!(
                    "sentence {start}..{end} is not a char range of its {}-byte text",
                    text.len()
                ))
            }
        })
        .collect()
}

/// Without vectors both are empty; with them, one row per sentence and one for the section, all
/// of `dim` dimensions.
fn check_vectors(
    dim: u32,
    sentences: usize,
    sentence_vectors: &[u8],
    section_vector: &[u8],
) -> Result<(), String> {
    if dim == 0 {
        return if sentence_vectors.is_empty() && section_vector.is_empty() {
            Ok(())
        } else {
            Err("vectors in a version that names no model".into())
        };
    }
    let rows = |bytes: &[u8], what: &str| {
        let vectors = QuantizedVectors::from_bytes(bytes).map_err(|e| format!("{what}: {e}"))?;
        if vectors.dim() != dim as usize {
            return Err(format!(
                "{what} of {} dimensions, the version says {dim}",
                vectors.dim()
            ));
        }
        Ok(vectors.len())
    };
    let sentence_rows = if sentence_vectors.is_empty() && sentences == 0 {
        0
    } else {
        rows(sentence_vectors, "sentence vectors")?
    };
    if sentence_rows != sentences {
        return Err(format!(
            "{sentence_rows} sentence vectors for {sentences} sentences"
        ));
    }
    if !section_vector.is_empty() && rows(section_vector, "section vector")? != 1 {
        return Err("a section vector of more than one row".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::embed::VectorMatrix;

    fn vectors(rows: usize, dim: usize) -> Vec<u8> {
        let values: Vec<f32> = (0..rows * dim).map(|i| (i % 7) as f32 - 3.0).collect();
        QuantizedVectors::from_matrix(&VectorMatrix::from_values(dim, values).unwrap()).to_bytes()
    }

    fn record() -> DocumentRecord {
        let text = "Héllo there. Second one.".to_string();
        DocumentRecord {
            doc_id: "d".into(),
            title: "T".into(),
            metadata: BTreeMap::from([("k".to_string(), "v".to_string())]),
            text_bytes: text.len() as u64,
            version: 7,
            sections: vec![SectionRecord {
                ordinal: 0,
                heading_path: vec!["H".into()],
                byte_start: 0,
                char_start: 0,
                section_key: section_key("d", 0, 7),
                sentences: vec![0..13, 14..text.len() as u32],
                sentence_vectors: vectors(2, 4),
                section_vector: vectors(1, 4),
                text,
                gap_after: " ".into(),
            }],
        }
    }

    fn upsert(record: DocumentRecord) -> Entry {
        Entry::Upsert {
            collection: "c".into(),
            record,
            vectors: VectorStamp {
                model: "static".into(),
                dim: 4,
            },
        }
    }

    fn decoded_record(bytes: &[u8]) -> Result<DocumentRecord, Malformed> {
        match decode(bytes)? {
            Decoded::Entry(Entry::Upsert { record, .. }) => Ok(record),
            other => panic!("not an upsert: {other:?}"),
        }
    }

    #[test]
    fn a_version_comes_back_exactly_as_it_was_written() {
        let written = record();
        let read = decoded_record(&encode(upsert(written.clone()))).unwrap();
        assert_eq!(format!("{read:?}"), format!("{written:?}"));
        let settings = StoredSettings {
            budget_tokenizer: "minilm".into(),
            section_tokens: 256,
            default_strategy: Some("sentence".into()),
            default_max_tokens: Some(64),
            default_overlap_tokens: None,
            log_created: None,
        };
        let created = encode(Entry::CollectionCreated {
            name: "c".into(),
            settings: settings.clone(),
        });
        match decode(&created).unwrap() {
            Decoded::Entry(Entry::CollectionCreated { name, settings: s }) => {
                assert_eq!((name.as_str(), s), ("c", settings));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn alias_entries_come_back_as_written_and_bad_names_are_refused() {
        let set = encode(Entry::AliasSet {
            alias: "live".into(),
            collection: "v2".into(),
        });
        match decode(&set).unwrap() {
            Decoded::Entry(Entry::AliasSet { alias, collection }) => {
                assert_eq!((alias.as_str(), collection.as_str()), ("live", "v2"));
            }
            other => panic!("{other:?}"),
        }
        let deleted = encode(Entry::AliasDeleted {
            alias: "live".into(),
        });
        assert!(matches!(
            decode(&deleted).unwrap(),
            Decoded::Entry(Entry::AliasDeleted { ref alias }) if alias == "live"
        ));
        let bad = encode(Entry::AliasSet {
            alias: "live".into(),
            collection: "a.b".into(),
        });
        let Malformed(why) = decode(&bad).unwrap_err();
        assert!(why.contains("`a.b`"), "{why}");
    }

    #[test]
    fn malformed_entries_are_refused_with_what_is_wrong() {
        type Damage = fn(&mut DocumentRecord);
        let cases: [(&str, Damage); 5] = [
            ("does not derive", |r| r.sections[0].section_key ^= 1),
            ("not a char range", |r| r.sections[0].sentences[0] = 0..2),
            ("not a char range", |r| r.sections[0].sentences[1] = 14..99),
            ("1 sentence vectors for 2", |r| {
                r.sections[0].sentence_vectors = vectors(1, 4)
            }),
            ("of 3 dimensions", |r| {
                r.sections[0].section_vector = vectors(1, 3)
            }),
        ];
        for (expected, damage) in cases {
            let mut broken = record();
            damage(&mut broken);
            let error = decoded_record(&encode(upsert(broken))).unwrap_err();
            assert!(error.0.contains(expected), "{expected}: {error}");
        }
        assert!(decode(b"\xff\xff\xff")
            .unwrap_err()
            .0
            .contains("not a log entry"));
        assert!(decode(&proto::LogEntry { entry: None }.encode_to_vec())
            .unwrap_err()
            .0
            .contains("does not know"));
    }
}
