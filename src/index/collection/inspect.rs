//! Read-only views of a collection's stored data for tools that check the index from outside
//! the query path (`lathe-bench` measures the dense leg's recall against exact search over these
//! vectors; `lathe export` writes out the live documents; a replica re-seeding a lost write log
//! publishes every live document's stored version). Nothing here is used when serving.

use std::collections::{BTreeMap, BTreeSet};

use tantivy::DocAddress;

use super::handle::CollectionIndex;
use super::records::{DocumentRecord, SectionRecord};
use super::schema::HEADING_SEPARATOR;
use super::section_document::{decode_ranges, decode_verified_section, first_vector_row};
use super::snapshot::Snapshot;
use crate::error::{LatheError, Result};

/// One live document as the index stores it: what `lathe export` writes out.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredDocument {
    pub doc_id: String,
    pub title: String,
    pub metadata: BTreeMap<String, String>,
    /// Bytes of the whole document text (the `doc_bytes` of its first section), when stored.
    pub text_bytes: Option<u64>,
    /// Its sections in ordinal order, all of one version.
    pub sections: Vec<StoredDocumentSection>,
}

/// One section of a [`StoredDocument`]: its text and where it lies in the document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDocumentSection {
    pub ordinal: u64,
    pub heading_path: Vec<String>,
    pub text: String,
    /// The whitespace stored after it (`SectionRecord::gap_after`): empty when none is stored.
    pub gap_after: String,
    pub byte_start: u64,
    pub char_start: u64,
}

impl CollectionIndex {
    /// The section vector stored with every live section that has one, keyed by section key, in
    /// index order: the vectors the dense index is built from, as stored (the ground truth of an
    /// exact nearest-neighbour search). A section failing verification is an error: a tool
    /// measuring the index wants to know, not to skip it.
    pub fn stored_section_vectors(&self) -> Result<Vec<(u64, Vec<f32>)>> {
        let snapshot = self.snapshot();
        let mut vectors = Vec::new();
        for (segment_ord, segment) in snapshot.searcher.segment_readers().iter().enumerate() {
            for doc in segment.doc_ids_alive() {
                let address = DocAddress::new(segment_ord as u32, doc);
                let (bytes, expected_key) = snapshot.stored_bytes(address).map_err(|why| {
                    LatheError::internal(format!("section at {address:?}: {why}"))
                })?;
                let section =
                    decode_verified_section(&bytes, expected_key, &self.fields).map_err(|why| {
                        LatheError::internal(format!("section at {address:?}: {why}"))
                    })?;
                if let Some(vector) = first_vector_row(section.section_vector) {
                    vectors.push((section.section_key, vector));
                }
            }
        }
        Ok(vectors)
    }
}

impl CollectionIndex {
    /// Hands every live document of the current commit to `visit`, one at a time and in
    /// `doc_id` order, with its sections in ordinal order. Only the positions of the live
    /// sections (and each document's id) are held for the whole index; a document's stored
    /// sections are read, verified and decoded when its turn comes, so memory stays one
    /// document's text whatever the collection's size. A section failing verification, or a
    /// document with live sections of two versions (a writer replaces every section of a
    /// document in one commit, so this is damage), is an error naming the document.
    pub fn for_each_stored_document(
        &self,
        mut visit: impl FnMut(StoredDocument) -> Result<()>,
    ) -> Result<()> {
        self.for_each_stored_version(|record, text_bytes| {
            visit(StoredDocument {
                doc_id: record.doc_id,
                title: record.title,
                metadata: record.metadata,
                text_bytes,
                sections: record
                    .sections
                    .into_iter()
                    .map(|section| StoredDocumentSection {
                        ordinal: section.ordinal,
                        heading_path: section.heading_path,
                        text: section.text,
                        gap_after: section.gap_after,
                        byte_start: section.byte_start,
                        char_start: section.char_start,
                    })
                    .collect(),
            })
        })
    }

    /// [`CollectionIndex::for_each_stored_document`] as whole versions, vectors and sentence
    /// ranges included: what a writer took, so that writing them again (here or on another
    /// replica) stores the same sections under the same keys. A version whose document length
    /// was not stored gets the end of its last section and the whitespace after it.
    pub fn for_each_stored_record(
        &self,
        mut visit: impl FnMut(DocumentRecord) -> Result<()>,
    ) -> Result<()> {
        self.for_each_stored_version(|mut record, text_bytes| {
            record.text_bytes = text_bytes.unwrap_or_else(|| {
                record.sections.last().map_or(0, |last| {
                    last.byte_start + (last.text.len() + last.gap_after.len()) as u64
                })
            });
            visit(record)
        })
    }

    /// Every live document's version and its stored length (see
    /// [`CollectionIndex::for_each_stored_document`] for the order, the memory and the errors).
    fn for_each_stored_version(
        &self,
        mut visit: impl FnMut(DocumentRecord, Option<u64>) -> Result<()>,
    ) -> Result<()> {
        let snapshot = self.snapshot();
        let mut documents: BTreeMap<String, Vec<DocAddress>> = BTreeMap::new();
        let mut doc_id = String::new();
        for (segment_ord, segment) in snapshot.searcher.segment_readers().iter().enumerate() {
            let column = segment.fast_fields().str("doc_id").ok().flatten();
            for doc in segment.doc_ids_alive() {
                let address = DocAddress::new(segment_ord as u32, doc);
                doc_id.clear();
                let found = column.as_ref().and_then(|column| {
                    let ordinal = column.term_ords(doc).next()?;
                    column.ord_to_str(ordinal, &mut doc_id).ok()
                });
                if found != Some(true) {
                    return Err(LatheError::internal(format!(
                        "section at {address:?}: its `doc_id` fast field holds no id"
                    )));
                }
                match documents.get_mut(doc_id.as_str()) {
                    Some(addresses) => addresses.push(address),
                    None => {
                        documents.insert(doc_id.clone(), vec![address]);
                    }
                }
            }
        }
        for (doc_id, mut addresses) in documents {
            // In doc-store order: each block is decompressed once for the document's sections.
            addresses.sort();
            let (record, text_bytes) = self.read_stored_version(&snapshot, doc_id, &addresses)?;
            visit(record, text_bytes)?;
        }
        Ok(())
    }

    /// The version of `doc_id` its live sections at `addresses` hold, and the document's stored
    /// length (see [`CollectionIndex::for_each_stored_document`]).
    fn read_stored_version(
        &self,
        snapshot: &Snapshot,
        doc_id: String,
        addresses: &[DocAddress],
    ) -> Result<(DocumentRecord, Option<u64>)> {
        let damaged = |why: String| LatheError::internal(format!("document `{doc_id}`: {why}"));
        let mut versions = BTreeSet::new();
        let mut sections = Vec::with_capacity(addresses.len());
        let (mut title, mut metadata_json, mut text_bytes) = (String::new(), String::new(), None);
        for &address in addresses {
            let (bytes, expected_key) = snapshot
                .stored_bytes(address)
                .map_err(|why| damaged(format!("section at {address:?}: {why}")))?;
            let section = decode_verified_section(&bytes, expected_key, &self.fields)
                .map_err(|why| damaged(format!("section at {address:?}: {why}")))?;
            versions.insert(section.version);
            if sections.is_empty() {
                title = section.doc_title.to_string();
                metadata_json = section.metadata_json.to_string();
            }
            if section.ordinal == 0 {
                text_bytes = snapshot
                    .searcher
                    .segment_reader(address.segment_ord)
                    .fast_fields()
                    .u64("doc_bytes")
                    .ok()
                    .and_then(|column| column.first(address.doc_id));
            }
            sections.push(SectionRecord {
                ordinal: section.ordinal,
                heading_path: if section.heading_path.is_empty() {
                    Vec::new()
                } else {
                    section
                        .heading_path
                        .split(HEADING_SEPARATOR)
                        .map(str::to_string)
                        .collect()
                },
                text: section.text.to_string(),
                gap_after: section.gap_after.to_string(),
                byte_start: section.byte_start,
                char_start: section.char_start,
                section_key: section.section_key,
                sentences: decode_ranges(section.sentence_ranges),
                sentence_vectors: section.sentence_vectors.to_vec(),
                section_vector: section.section_vector.to_vec(),
            });
        }
        if versions.len() > 1 {
            return Err(damaged(format!(
                "live sections of {} versions ({versions:x?})",
                versions.len()
            )));
        }
        let metadata = serde_json::from_str(&metadata_json)
            .map_err(|error| damaged(format!("stored metadata: {error}")))?;
        sections.sort_by_key(|section| section.ordinal);
        let record = DocumentRecord {
            doc_id,
            title,
            metadata,
            text_bytes: 0,
            version: versions.into_iter().next().unwrap_or_default(),
            sections,
        };
        Ok((record, text_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::super::records::{section_key, WriteOp};
    use super::super::testing::{document, open, open_dense, vector_bytes, write_and_wait};
    use super::StoredDocument;

    #[test]
    fn stored_section_vectors_are_the_live_sections_vectors_as_written() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open_dense(&data_dir.path().join("index"), 4).unwrap();
        let mut a = document("a", 1, &["boats in the harbour"]);
        a.sections[0].section_vector = vector_bytes(&[1.0, 0.0, 0.0, 0.0]);
        let mut b = document("b", 1, &["hazards in their line of sight"]);
        b.sections[0].section_vector = vector_bytes(&[0.0, 0.6, 0.8, 0.0]);
        write_and_wait(&index, vec![WriteOp::Upsert(a), WriteOp::Upsert(b)]);
        write_and_wait(
            &index,
            vec![WriteOp::Delete {
                doc_id: "a".to_string(),
            }],
        );

        let vectors = index.stored_section_vectors().unwrap();
        assert_eq!(vectors.len(), 1, "the deleted section is not live");
        assert_eq!(vectors[0].0, section_key("b", 0, 1));
        // Stored quantised: equal to the written vector within quantisation error.
        for (got, want) in vectors[0].1.iter().zip([0.0, 0.6, 0.8, 0.0]) {
            assert!((got - want).abs() < 0.02, "{:?}", vectors[0].1);
        }
    }

    #[test]
    fn stored_records_are_the_versions_as_written_vectors_and_keys_included() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open_dense(&data_dir.path().join("index"), 4).unwrap();
        let mut a = document("a", 3, &["boats in the harbour. Gulls above.", "the quay"]);
        a.sections[0].sentences = vec![0..21, 22..34];
        a.sections[0].heading_path = vec!["Port".to_string(), "Boats".to_string()];
        a.sections[0].gap_after = "\n".to_string();
        a.sections[1].byte_start = 35;
        a.sections[1].char_start = 35;
        a.text_bytes = 43;
        for (k, section) in a.sections.iter_mut().enumerate() {
            section.section_vector = vector_bytes(&[1.0, k as f32, 0.0, 0.5]);
            let rows = section.sentences.len();
            let values = (0..rows * 4).map(|v| (v + k) as f32 / 8.0).collect();
            let matrix = crate::embed::VectorMatrix::from_values(4, values).unwrap();
            section.sentence_vectors =
                crate::embed::QuantizedVectors::from_matrix(&matrix).to_bytes();
        }
        write_and_wait(&index, vec![WriteOp::Upsert(a.clone())]);

        let mut seen = Vec::new();
        index
            .for_each_stored_record(|record| {
                seen.push(record);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen.len(), 1);
        let got = &seen[0];
        assert_eq!(
            (
                &got.doc_id,
                &got.title,
                &got.metadata,
                got.text_bytes,
                got.version
            ),
            (&a.doc_id, &a.title, &a.metadata, a.text_bytes, a.version)
        );
        assert_eq!(got.sections.len(), a.sections.len());
        for (got, want) in got.sections.iter().zip(&a.sections) {
            assert_eq!(
                (got.ordinal, &got.heading_path, &got.text, &got.gap_after),
                (
                    want.ordinal,
                    &want.heading_path,
                    &want.text,
                    &want.gap_after
                )
            );
            assert_eq!(
                (got.byte_start, got.char_start, got.section_key),
                (want.byte_start, want.char_start, want.section_key)
            );
            assert_eq!(got.sentences, want.sentences);
            assert_eq!(got.sentence_vectors, want.sentence_vectors);
            assert_eq!(got.section_vector, want.section_vector);
        }
    }

    #[test]
    fn stored_documents_are_the_live_ones_latest_version_sections_in_order() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open(&data_dir.path().join("index")).unwrap();
        let mut b = document("b", 1, &["first part", "second part", "third part"]);
        b.sections[1].heading_path = vec!["Outer".to_string(), "Inner".to_string()];
        b.sections[0].gap_after = "\n\n".to_string();
        b.text_bytes = 40;
        write_and_wait(
            &index,
            vec![
                WriteOp::Upsert(document("a", 1, &["old text of a"])),
                WriteOp::Upsert(b),
                WriteOp::Upsert(document("gone", 1, &["deleted soon"])),
            ],
        );
        write_and_wait(
            &index,
            vec![
                WriteOp::Upsert(document("a", 2, &["new text", "of a"])),
                WriteOp::Delete {
                    doc_id: "gone".to_string(),
                },
            ],
        );

        let mut seen: Vec<StoredDocument> = Vec::new();
        index
            .for_each_stored_document(|document| {
                seen.push(document);
                Ok(())
            })
            .unwrap();
        let ids: Vec<&str> = seen.iter().map(|d| d.doc_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "live documents, in id order");
        let texts = |d: &StoredDocument| -> Vec<String> {
            d.sections.iter().map(|s| s.text.clone()).collect()
        };
        assert_eq!(
            texts(&seen[0]),
            ["new text", "of a"],
            "the latest version only"
        );
        assert_eq!(texts(&seen[1]), ["first part", "second part", "third part"]);
        assert_eq!(seen[1].sections[0].gap_after, "\n\n");
        assert_eq!(seen[1].sections[1].heading_path, ["Outer", "Inner"]);
        assert_eq!(seen[1].sections[2].byte_start, 21);
        assert_eq!(seen[1].text_bytes, Some(40));
        assert_eq!(seen[1].metadata.get("lang").map(String::as_str), Some("en"));
    }
}
