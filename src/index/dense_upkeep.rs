//! Keeping a collection's dense index (section vectors in hnsw, see `crate::dense`) in step with
//! its tantivy index, the one source of truth: [`rebuild_from_stored_sections`] builds it at open
//! from the vectors stored with the sections; afterwards the writer notes each write in a
//! [`DenseUpkeep`] and applies them at commit, before the new snapshot is swapped in: the
//! replaced and deleted sections' vectors are tombstoned (left live, they would crowd the live
//! sections out of the nearest neighbours), the new ones inserted, and the graph compacted once
//! tombstones pass their share.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tantivy::collector::TopDocs;
use tantivy::query::TermQuery;
use tantivy::schema::IndexRecordOption;
use tantivy::{DocAddress, Searcher, Term};

use super::integrity::Integrity;
use super::reader::{stored_document_id, Snapshot};
use super::records::DocumentRecord;
use super::schema::SectionFields;
use super::section_document::decode_verified_section;
use crate::dense::{DenseIndex, DenseIndexConfig};
use crate::embed::QuantizedVectors;
use crate::error::{LatheError, Result};

/// A collection's dense index, shared by its readers and its writer (the only one to change it).
pub type SharedDenseIndex = Arc<RwLock<DenseIndex>>;

/// A section's dense-index key and vector.
type KeyedVector = (u64, Vec<f32>);

/// What the writer owes the dense index since its last commit.
pub struct DenseUpkeep {
    dense: SharedDenseIndex,
    /// Documents written since the last commit: their new section vectors, or `None` if deleted.
    pending: HashMap<String, Option<Vec<KeyedVector>>>,
}

impl DenseUpkeep {
    pub fn new(dense: SharedDenseIndex) -> Self {
        Self {
            dense,
            pending: HashMap::new(),
        }
    }

    /// The document was deleted: its vectors go at the next commit.
    pub fn deleted(&mut self, doc_id: String) {
        self.pending.insert(doc_id, None);
    }

    /// The document was replaced by `document`: its old vectors go at the next commit, and the
    /// new sections' vectors come in (a section without one is found by BM25 only).
    pub fn upserted(&mut self, document: &DocumentRecord) {
        let vectors = document
            .sections
            .iter()
            .filter_map(|section| {
                decode_one_vector(&section.section_vector).map(|v| (section.section_key, v))
            })
            .collect();
        self.pending.insert(document.doc_id.clone(), Some(vectors));
    }

    /// Forgets what was noted since the last commit (the writes were abandoned).
    pub fn discard_pending(&mut self) {
        self.pending.clear();
    }

    /// The keys of the sections the pending documents have in `searcher`, i.e. before the commit
    /// that replaces or deletes them. Read from the `section_key` fast field: no stored bytes are
    /// decoded on the writer thread.
    pub fn replaced_section_keys(&self, searcher: &Searcher, fields: &SectionFields) -> Vec<u64> {
        let mut keys = Vec::new();
        for doc_id in self.pending.keys() {
            let query = TermQuery::new(
                Term::from_field_text(fields.doc_id, doc_id),
                IndexRecordOption::Basic,
            );
            let Ok(found) =
                searcher.search(&query, &TopDocs::with_limit(1_000_000).order_by_score())
            else {
                continue;
            };
            for (_, address) in found {
                let segment = searcher.segment_reader(address.segment_ord);
                if let Ok(column) = segment.fast_fields().u64("section_key") {
                    keys.extend(column.first(address.doc_id));
                }
            }
        }
        keys
    }

    /// Tombstones `replaced_keys`, inserts the pending vectors, and compacts the graph when
    /// tombstones passed their share.
    pub fn apply(&mut self, replaced_keys: Vec<u64>) -> Result<()> {
        let needs_rebuild = {
            let mut dense = self.dense.write().unwrap_or_else(|p| p.into_inner());
            for key in replaced_keys {
                dense.delete(key);
            }
            for (_, vectors) in self.pending.drain() {
                for (key, vector) in vectors.into_iter().flatten() {
                    dense
                        .insert(key, &vector)
                        .map_err(|e| LatheError::internal(format!("dense insert: {e}")))?;
                }
            }
            dense.needs_rebuild()
        };
        if needs_rebuild {
            self.compact()?;
        }
        Ok(())
    }

    /// Replaces the graph by a fresh one of its live vectors. Compaction rebuilds the whole graph
    /// (seconds for thousands of sections). The writer is the dense index's only writer, so
    /// nothing changes it while the fresh graph is built from a copy of its live vectors: queries
    /// keep searching the old graph under the read lock and wait only for the swap.
    fn compact(&self) -> Result<()> {
        let started = Instant::now();
        let (config, live) = {
            let dense = self.dense.read().unwrap_or_else(|p| p.into_inner());
            (dense.config().clone(), dense.live_vectors())
        };
        let mut fresh = DenseIndex::new(config)
            .map_err(|e| LatheError::internal(format!("dense rebuild: {e}")))?;
        fresh
            .rebuild(live)
            .map_err(|e| LatheError::internal(format!("dense rebuild: {e}")))?;
        let replaced = std::mem::replace(
            &mut *self.dense.write().unwrap_or_else(|p| p.into_inner()),
            fresh,
        );
        // Freeing the old graph takes time too: not under the lock.
        drop(replaced);
        tracing::info!(
            seconds = started.elapsed().as_secs_f32(),
            "dense index compacted"
        );
        Ok(())
    }
}

/// Builds the dense index from the section vectors stored in every live section. A section that
/// fails verification is recorded and left out (reading its document answers DATA_LOSS anyway).
pub fn rebuild_from_stored_sections(
    snapshot: &Snapshot,
    fields: &SectionFields,
    dim: usize,
    integrity: &Integrity,
) -> Result<DenseIndex> {
    let mut vectors: Vec<KeyedVector> = Vec::new();
    let searcher = &snapshot.searcher;
    for (segment_ord, segment) in searcher.segment_readers().iter().enumerate() {
        for doc in segment.doc_ids_alive() {
            let address = DocAddress::new(segment_ord as u32, doc);
            let section = snapshot
                .stored_bytes(address)
                .and_then(|(bytes, expected_key)| {
                    decode_verified_section(&bytes, expected_key, fields).map(|section| {
                        (
                            section.section_key,
                            decode_one_vector(section.section_vector),
                        )
                    })
                });
            match section {
                Ok((key, Some(vector))) if vector.len() == dim => vectors.push((key, vector)),
                Ok(_) => {}
                Err(why) => {
                    let document = stored_document_id(searcher, address)
                        .unwrap_or_else(|| format!("at segment {segment_ord} position {doc}"));
                    integrity.record(format!("document `{document}`: {why}"));
                }
            }
        }
    }
    let mut config = DenseIndexConfig::new(dim);
    config.capacity_hint = config.capacity_hint.max(vectors.len() * 2);
    let mut dense =
        DenseIndex::new(config).map_err(|e| LatheError::internal(format!("dense index: {e}")))?;
    let started = Instant::now();
    dense
        .insert_many(
            vectors
                .iter()
                .map(|(key, vector)| (*key, vector.as_slice())),
        )
        .map_err(|e| LatheError::internal(format!("dense index: {e}")))?;
    tracing::info!(
        vectors = vectors.len(),
        seconds = started.elapsed().as_secs_f32(),
        "dense index rebuilt"
    );
    Ok(dense)
}

/// The first row of one `QuantizedVectors` blob.
fn decode_one_vector(bytes: &[u8]) -> Option<Vec<f32>> {
    let vectors = QuantizedVectors::from_bytes(bytes).ok()?;
    if vectors.is_empty() {
        return None;
    }
    let mut out = vec![0.0; vectors.dim()];
    vectors.row_into(0, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{document, open_dense, vector_bytes, write_and_wait};
    use super::super::{section_key, CollectionIndex, WriteOp};
    use crate::types::{DenseStats, Filter};

    /// A one-section document at `version` whose section vector is `vector`.
    fn with_vector(doc_id: &str, version: u64, vector: [f32; 4]) -> WriteOp {
        let mut record = document(doc_id, version, &["boats in the harbour"]);
        record.sections[0].section_vector = vector_bytes(&vector);
        WriteOp::Upsert(record)
    }

    fn dense_stats(index: &CollectionIndex) -> DenseStats {
        index.stats().unwrap().dense.unwrap()
    }

    /// The section keys of the dense hits nearest `query`, best first.
    fn nearest(index: &CollectionIndex, query: [f32; 4]) -> Vec<u64> {
        let snapshot = index.snapshot();
        let hits = index.search_dense(&snapshot, &query, &Filter::default(), 8);
        hits.unwrap().iter().map(|hit| hit.section_key).collect()
    }

    #[test]
    fn replaced_and_deleted_vectors_are_tombstoned_and_a_reopen_rebuilds_the_live_ones() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = data_dir.path().join("index");
        let index = open_dense(&path, 4).unwrap();
        write_and_wait(
            &index,
            vec![
                with_vector("a", 1, [1.0, 0.0, 0.0, 0.0]),
                with_vector("b", 1, [0.0, 1.0, 0.0, 0.0]),
            ],
        );
        let both = DenseStats {
            vectors: 2,
            sections_with_vector: 2,
        };
        assert_eq!(dense_stats(&index), both);

        // The old version's vector is tombstoned, not left beside the new one.
        write_and_wait(&index, vec![with_vector("a", 2, [0.0, 0.0, 1.0, 0.0])]);
        assert_eq!(dense_stats(&index), both);
        let (a_new, b) = (section_key("a", 0, 2), section_key("b", 0, 1));
        assert_eq!(nearest(&index, [0.0, 0.0, 1.0, 0.0])[0], a_new);
        assert!(!nearest(&index, [1.0, 0.0, 0.0, 0.0]).contains(&section_key("a", 0, 1)));

        write_and_wait(
            &index,
            vec![WriteOp::Delete {
                doc_id: "b".to_string(),
            }],
        );
        let one = DenseStats {
            vectors: 1,
            sections_with_vector: 1,
        };
        assert_eq!(dense_stats(&index), one);
        assert_eq!(nearest(&index, [0.0, 1.0, 0.0, 0.0]), [a_new]);
        drop(index);

        // Rebuilt at open from the vectors stored with the live sections only.
        let reopened = open_dense(&path, 4).unwrap();
        assert_eq!(dense_stats(&reopened), one);
        assert_eq!(nearest(&reopened, [0.0, 0.0, 1.0, 0.0]), [a_new]);
        assert!(!nearest(&reopened, [0.0, 1.0, 0.0, 0.0]).contains(&b));
    }
}
