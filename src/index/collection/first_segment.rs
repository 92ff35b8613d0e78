//! The first write of an empty collection, written as the index's one segment without opening a
//! tantivy `IndexWriter`.
//!
//! An `IndexWriter` costs a fixed amount however small the write: it starts its indexing
//! threads, segment updater and merge pool, takes its lock file, and gives each new segment a
//! term hash table of 2^19 slots (4 MiB, filled at creation and walked whole when the segment is
//! written, since tantivy sizes it from the memory budget and its smallest budget already
//! reaches the cap). For a tenant's collection of one small document, skipping all that takes
//! the server's CPU for creating it from 9.5 to 5.5 ms (BENCHMARKS.md, "Idle collections").
//! Here the write goes through tantivy's public
//! [`SegmentWriter`] on the writer's own thread, with a budget sized to the text (the table
//! doubles when it must, as it always does), and the new `meta.json` lists that segment: what
//! tantivy's own `SingleSegmentIndexWriter` does, with Lathe's opstamp and commit payload kept.
//!
//! Only when nothing can need a delete: the index has no segment, nothing is uncommitted, and
//! the write upserts distinct documents, each with sections.

use std::collections::HashSet;
use std::path::Path;

use tantivy::directory::Directory;
use tantivy::indexer::{AddOperation, SegmentWriter};
use tantivy::Index;

use super::records::{DocumentRecord, WriteOp};
use super::schema::SectionFields;
use super::section_document::section_documents;
use crate::error::{LatheError, Result};

/// Most text a first write may have to take this path; a larger one (a bulk upload into a new
/// collection) goes through the `IndexWriter`, whose indexing threads work side by side and
/// whose arena bounds its memory.
const MAX_TEXT_BYTES: usize = 256 * 1024;

/// tantivy's term table holds `budget / 24` slots at most (8 bytes a slot, a third of the
/// budget), rounded down to a power of two from 2^10 to 2^19.
const BUDGET_PER_TABLE_SLOT: usize = 24;

/// A write that may become an empty index's first segment.
pub(super) struct FirstWrite {
    pub documents: Vec<DocumentRecord>,
    text_bytes: usize,
}

impl FirstWrite {
    /// `ops` as a first write when they may be one: upserts only, of distinct documents, each
    /// with at least one section, at most [`MAX_TEXT_BYTES`] of section text in all; else `ops`
    /// back. The caller checks that the index is empty and nothing is uncommitted.
    pub(super) fn of(ops: Vec<WriteOp>) -> std::result::Result<FirstWrite, Vec<WriteOp>> {
        let mut doc_ids = HashSet::with_capacity(ops.len());
        let mut text_bytes = 0;
        for op in &ops {
            let WriteOp::Upsert(document) = op else {
                return Err(ops);
            };
            text_bytes += document
                .sections
                .iter()
                .map(|section| section.text.len())
                .sum::<usize>();
            if document.sections.is_empty()
                || text_bytes > MAX_TEXT_BYTES
                || !doc_ids.insert(document.doc_id.as_str())
            {
                return Err(ops);
            }
        }
        let documents = ops
            .into_iter()
            .filter_map(|op| match op {
                WriteOp::Upsert(document) => Some(document),
                WriteOp::Delete { .. } => None,
            })
            .collect();
        Ok(FirstWrite {
            documents,
            text_bytes,
        })
    }

    /// The write's ops again, to apply through an `IndexWriter` after all.
    pub(super) fn into_ops(self) -> impl Iterator<Item = WriteOp> {
        self.documents.into_iter().map(WriteOp::Upsert)
    }

    /// Writes the documents as the one segment of `index`, which must have none, and commits it
    /// with `payload`; returns the commit's opstamp. On an error nothing is committed: the
    /// segment's files are left unlisted, for the next `IndexWriter` commit to collect.
    pub(super) fn commit(
        self,
        index: &Index,
        fields: &SectionFields,
        payload: Option<String>,
    ) -> Result<u64> {
        let mut meta = index.load_metas()?;
        if !meta.segments.is_empty() {
            return Err(LatheError::internal(
                "a first segment was written into an index that has segments",
            ));
        }
        let segment = index.new_segment();
        let mut writer =
            SegmentWriter::for_segment(memory_budget(self.text_bytes), segment.clone())?;
        let mut opstamp = meta.opstamp;
        for document in &self.documents {
            for tantivy_document in section_documents(document, fields)? {
                writer.add_document(AddOperation {
                    opstamp,
                    document: tantivy_document,
                })?;
                opstamp += 1;
            }
        }
        let max_doc = writer.max_doc();
        writer.finalize()?;
        meta.segments = vec![segment.with_max_doc(max_doc).meta().clone()];
        meta.opstamp = opstamp;
        meta.payload = payload;
        // As tantivy's `SingleSegmentIndexWriter` saves its metas: each of the segment's files
        // was synced as it was written, the folder is synced before `meta.json` is replaced
        // atomically, and after, so that the replacement is durable before the write is
        // answered.
        let mut json = serde_json::to_vec_pretty(&meta).map_err(tantivy::TantivyError::from)?;
        json.push(b'\n');
        let directory = index.directory();
        directory
            .sync_directory()
            .map_err(tantivy::TantivyError::from)?;
        directory
            .atomic_write(Path::new("meta.json"), &json)
            .map_err(tantivy::TantivyError::from)?;
        directory
            .sync_directory()
            .map_err(tantivy::TantivyError::from)?;
        Ok(opstamp)
    }
}

/// The smallest budget whose term table has a slot for every two bytes of text (a term is
/// rarely shorter, and the table doubles when half full anyway).
fn memory_budget(text_bytes: usize) -> usize {
    (text_bytes / 2).next_power_of_two().max(1 << 10) * BUDGET_PER_TABLE_SLOT
        + BUDGET_PER_TABLE_SLOT
}

#[cfg(test)]
mod tests {
    use super::super::handle::CollectionIndex;
    use super::super::testing::{document, open_dense, record, vector_bytes, write_and_wait};
    use super::*;
    use crate::types::Filter;

    fn doc_ids(ops: &[WriteOp]) -> Vec<&str> {
        ops.iter()
            .map(|op| match op {
                WriteOp::Upsert(document) => document.doc_id.as_str(),
                WriteOp::Delete { doc_id } => doc_id.as_str(),
            })
            .collect()
    }

    /// `document` with a 4-dimensional section vector on each section.
    fn with_vectors(mut document: DocumentRecord, seed: f32) -> WriteOp {
        for (i, section) in document.sections.iter_mut().enumerate() {
            section.section_vector = vector_bytes(&[seed, 1.0, i as f32, 0.5]);
        }
        WriteOp::Upsert(document)
    }

    fn papers() -> Vec<WriteOp> {
        vec![
            with_vectors(record("a", "hazards in their line of sight"), 1.0),
            with_vectors(
                document(
                    "b",
                    1,
                    &["boats in the harbour", "calm water, boats at rest"],
                ),
                -1.0,
            ),
        ]
    }

    /// What a reader sees of `index`: stats, the sections of each document, BM25 and dense hits.
    fn seen(index: &CollectionIndex) -> impl PartialEq + std::fmt::Debug {
        let snapshot = index.snapshot();
        let mut stats = index.stats().unwrap();
        stats.generation = 0;
        let lexical = ["hazards sight", "boats harbour", "calm water"].map(|query| {
            let terms = index.query_terms(query);
            index
                .search(&snapshot, &terms, &Filter::default(), 8)
                .unwrap()
        });
        let dense = [[1.0, 1.0, 0.0, 0.5], [-1.0, 1.0, 1.0, 0.5]].map(|query| {
            index
                .search_dense(&snapshot, &query, &Filter::default(), 8)
                .unwrap()
        });
        let sections = ["a", "b"].map(|doc_id| index.document_sections(doc_id).unwrap());
        (stats, sections, lexical, dense)
    }

    #[test]
    fn only_upserts_of_distinct_documents_with_sections_and_little_text_qualify() {
        let upsert = |doc_id, text| WriteOp::Upsert(record(doc_id, text));
        let first = FirstWrite::of(vec![upsert("a", "alpha beta"), upsert("b", "gamma")]).unwrap();
        assert_eq!(first.text_bytes, 15);
        let mut no_sections = record("c", "x");
        no_sections.sections.clear();
        let long = "word ".repeat(MAX_TEXT_BYTES / 5 + 1);
        let refused = [
            vec![upsert("a", "alpha"), upsert("a", "alpha again")],
            vec![upsert("a", "alpha"), WriteOp::Delete { doc_id: "b".into() }],
            vec![WriteOp::Upsert(no_sections)],
            vec![
                upsert("a", &long[..MAX_TEXT_BYTES / 2]),
                upsert("b", &long[..MAX_TEXT_BYTES / 2 + 1]),
            ],
        ];
        for ops in refused {
            let expected: Vec<String> = doc_ids(&ops).into_iter().map(String::from).collect();
            let back = FirstWrite::of(ops).err().expect("refused");
            assert_eq!(doc_ids(&back), expected, "given back whole, in order");
        }
        assert!(memory_budget(0) / BUDGET_PER_TABLE_SLOT >= 1 << 10);
        assert!(memory_budget(MAX_TEXT_BYTES) / BUDGET_PER_TABLE_SLOT > MAX_TEXT_BYTES / 2);
    }

    #[test]
    fn a_first_write_reads_as_the_same_write_through_an_index_writer() {
        let data_dir = tempfile::tempdir().unwrap();
        let first = open_dense(&data_dir.path().join("first"), 4).unwrap();
        let through_writer = open_dense(&data_dir.path().join("writer"), 4).unwrap();
        write_and_wait(&first, papers());
        // A delete of a document it does not have makes the same write go through the writer.
        let mut ops = vec![WriteOp::Delete {
            doc_id: "none".into(),
        }];
        ops.extend(papers());
        write_and_wait(&through_writer, ops);
        // The one segment, with no delete stamped before each add: no `IndexWriter` wrote it.
        let meta = tantivy::Index::open_in_dir(data_dir.path().join("first"))
            .unwrap()
            .load_metas()
            .unwrap();
        assert_eq!((meta.segments.len(), meta.opstamp), (1, 3));
        assert_eq!(seen(&first), seen(&through_writer));
        assert_eq!(
            first.stats().unwrap().dense.unwrap().sections_with_vector,
            3
        );

        // Later writes replace and delete what the first one wrote, and it all reopens.
        for index in [&first, &through_writer] {
            let replacement = with_vectors(document("a", 2, &["hazards ahead", "all clear"]), 2.0);
            write_and_wait(index, vec![replacement]);
            write_and_wait(index, vec![WriteOp::Delete { doc_id: "b".into() }]);
        }
        assert_eq!(first.document_sections("a").unwrap(), [(0, 2), (1, 2)]);
        assert_eq!(seen(&first), seen(&through_writer));
        first.shutdown();
        drop(first);
        let reopened = open_dense(&data_dir.path().join("first"), 4).unwrap();
        assert_eq!(seen(&reopened), seen(&through_writer));
    }

    #[test]
    fn a_held_first_write_goes_before_the_writes_after_it() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open_dense(&data_dir.path().join("index"), 4).unwrap();
        // Held uncommitted (the commit interval is an hour), then replaced by a write that may
        // not be a first write: the held one goes through the writer first.
        assert!(index.write(papers(), false).unwrap().is_none());
        assert_eq!(index.stats().unwrap().documents, 0);
        let replacement = with_vectors(document("a", 2, &["hazards ahead", "all clear"]), 2.0);
        let generation = write_and_wait(&index, vec![replacement.clone(), replacement]);
        assert_eq!(index.snapshot().generation, generation);
        assert_eq!(index.document_sections("a").unwrap(), [(0, 2), (1, 2)]);
        assert_eq!(index.document_sections("b").unwrap(), [(0, 1), (1, 1)]);
        let stats = index.stats().unwrap();
        assert_eq!((stats.documents, stats.sections), (2, 4));
        assert_eq!(stats.dense.unwrap().sections_with_vector, 4);
    }
}
