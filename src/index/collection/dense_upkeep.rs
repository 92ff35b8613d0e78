//! Keeping a collection's dense index (section vectors in segmented hnsw graphs, see
//! `crate::dense`) in step with its tantivy index, the one source of truth.
//!
//! At open, [`open_dense_index`] loads the sealed segments kept in the collection's `dense/`
//! folder, takes the live section keys from tantivy's `section_key` fast field (no stored bytes
//! decoded), treats every sealed key not live as a tombstone, and inserts again only the live
//! sections found in no sealed segment (written after the last seal, e.g. before a kill -9, or
//! in a segment found damaged), decoding just their stored vectors, one live segment's worth at
//! a time. So after a crash the lexical and dense indexes agree by construction.
//!
//! Afterwards the writer notes each write in a [`DenseUpkeep`] and applies them at commit, after
//! tantivy's commit and before the new snapshot is swapped in: the replaced and deleted
//! sections' vectors are tombstoned (left live, they would crowd the live sections out of the
//! nearest neighbours) and the new ones inserted into the live segment, which is sealed (dumped
//! and listed in the manifest) whenever it fills up, so nothing sealed is uncommitted. Sealed
//! segments with many tombstones, or four of one size tier, are merged on a background thread.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use tantivy::collector::TopDocs;
use tantivy::query::TermQuery;
use tantivy::schema::IndexRecordOption;
use tantivy::{DocAddress, Searcher, Term};

use super::integrity::Integrity;
use super::records::DocumentRecord;
use super::schema::SectionFields;
use super::section_document::{decode_verified_section, first_vector_row};
use super::snapshot::{stored_document_id, Snapshot};
use crate::dense::{DenseIndex, LoadedIndex};
use crate::error::{LatheError, Result};

/// A collection's dense index, shared by its readers and its writer. It needs no outer lock: see
/// `crate::dense` for what searches and writes share.
pub type SharedDenseIndex = Arc<DenseIndex>;

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
                first_vector_row(&section.section_vector).map(|v| (section.section_key, v))
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

    /// Tombstones `replaced_keys` and inserts the pending vectors (called after tantivy's commit:
    /// a seal this causes persists only committed sections). Starts a background merge when
    /// sealed segments call for one.
    pub fn apply(&mut self, replaced_keys: Vec<u64>) -> Result<()> {
        for key in replaced_keys {
            self.dense.delete(key);
        }
        let vectors: Vec<KeyedVector> = self
            .pending
            .drain()
            .flat_map(|(_, vectors)| vectors.into_iter().flatten())
            .collect();
        self.dense
            .insert_many(
                vectors
                    .iter()
                    .map(|(key, vector)| (*key, vector.as_slice())),
            )
            .map_err(|e| LatheError::internal(format!("dense insert: {e}")))?;
        self.start_merge_if_due();
        Ok(())
    }

    /// Seals the live segment at a clean close unless it is small (see
    /// [`DenseIndex::seal_at_close`]), so that the next open inserts little.
    pub fn seal_at_close(&self) {
        self.dense.seal_at_close();
    }

    /// Merges the sealed segments that call for it on a thread of its own: a merge rebuilds
    /// graphs (seconds per ten thousand vectors) and must hold up neither the writer nor queries.
    /// The thread goes on while merges are due, so the segments an open replayed (after kill -9,
    /// a damaged segment, or an index of an older format: every vector) or a burst of writes
    /// sealed are merged down to their tiers without waiting for another write.
    pub fn start_merge_if_due(&self) {
        let Some(mut ids) = claim_due_merge(&self.dense) else {
            return;
        };
        let dense = Arc::clone(&self.dense);
        let spawned = std::thread::Builder::new()
            .name("lathe-dense-merge".to_string())
            .spawn(move || loop {
                if let Err(error) = dense.merge_segments(&ids) {
                    tracing::error!(%error, "merging dense segments failed; they stay as they were");
                    return;
                }
                match claim_due_merge(&dense) {
                    Some(next) => ids = next,
                    None => return,
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start a dense merge thread; merging later");
            self.dense.abandon_merge();
        }
    }
}

/// The segments due a merge, with the right to merge them claimed; `None` when none is due or
/// a merge runs.
fn claim_due_merge(dense: &DenseIndex) -> Option<Vec<u64>> {
    let ids = dense.segments_to_merge()?;
    dense.try_start_merge().then_some(ids)
}

/// Opens the dense index whose sealed segments `loaded` holds ([`DenseIndex::load`], run while
/// tantivy's files were verified) for the sections of `snapshot` (see the module doc). A section
/// that fails verification while its vector is read is recorded and left out (reading its
/// document answers DATA_LOSS anyway).
pub fn open_dense_index(
    snapshot: &Snapshot,
    fields: &SectionFields,
    loaded: LoadedIndex,
    integrity: &Integrity,
) -> Result<DenseIndex> {
    let started = Instant::now();
    let searcher = &snapshot.searcher;
    let mut live_keys: HashSet<u64> = HashSet::with_capacity(searcher.num_docs() as usize);
    for segment in searcher.segment_readers() {
        let keys = segment.fast_fields().u64("section_key")?;
        for doc in segment.doc_ids_alive() {
            live_keys.extend(keys.first(doc));
        }
    }
    let load_seconds = loaded.took().as_secs_f32();
    let (dense, missing) = loaded.open(&live_keys);
    let replayed = if missing.is_empty() {
        0
    } else {
        // A whole index takes minutes (a million vectors about three on 2 cores): say so.
        tracing::info!(
            vectors = missing.len(),
            "dense index: inserting the stored vectors of the sections in no sealed segment"
        );
        insert_stored_vectors(
            &dense,
            snapshot,
            fields,
            &missing.into_iter().collect(),
            integrity,
        )?
    };
    let counters = dense.counters();
    tracing::info!(
        vectors = dense.len(),
        loaded_segments = counters.loaded_segments,
        damaged_segments = counters.damaged_segments,
        replayed,
        load_seconds,
        check_seconds = started.elapsed().as_secs_f32(),
        "dense index opened"
    );
    Ok(dense)
}

/// Inserts into `dense` the stored vectors of the live sections whose keys are in `wanted`, one
/// live segment's worth at a time: a replay of a whole index (an upgrade of its format, a lost
/// manifest) holds one batch of decoded vectors, not all of them. Returns how many.
pub(super) fn insert_stored_vectors(
    dense: &DenseIndex,
    snapshot: &Snapshot,
    fields: &SectionFields,
    wanted: &HashSet<u64>,
    integrity: &Integrity,
) -> Result<usize> {
    let batch = dense.config().seal_vectors.max(1);
    replay_stored_vectors(
        snapshot,
        fields,
        dense.config().dim,
        wanted,
        integrity,
        batch,
        |vectors| {
            dense
                .insert_many(
                    vectors
                        .iter()
                        .map(|(key, vector)| (*key, vector.as_slice())),
                )
                .map_err(|e| LatheError::internal(format!("dense index: {e}")))
        },
    )
}

/// Hands `insert` the stored vectors of the live sections whose keys are in `wanted` (only those
/// are decoded), `batch` at a time, in index order; returns how many it handed over.
fn replay_stored_vectors(
    snapshot: &Snapshot,
    fields: &SectionFields,
    dim: usize,
    wanted: &HashSet<u64>,
    integrity: &Integrity,
    batch: usize,
    mut insert: impl FnMut(&[KeyedVector]) -> Result<()>,
) -> Result<usize> {
    let mut vectors: Vec<KeyedVector> = Vec::with_capacity(batch.min(wanted.len()));
    let mut replayed = 0;
    let searcher = &snapshot.searcher;
    for (segment_ord, segment) in searcher.segment_readers().iter().enumerate() {
        let keys = segment.fast_fields().u64("section_key")?;
        for doc in segment.doc_ids_alive() {
            if !keys.first(doc).is_some_and(|key| wanted.contains(&key)) {
                continue;
            }
            let address = DocAddress::new(segment_ord as u32, doc);
            let section = snapshot
                .stored_bytes(address)
                .and_then(|(bytes, expected_key)| {
                    decode_verified_section(&bytes, expected_key, fields).map(|section| {
                        (
                            section.section_key,
                            first_vector_row(section.section_vector),
                        )
                    })
                });
            match section {
                Ok((key, Some(vector))) if vector.len() == dim => {
                    vectors.push((key, vector));
                    replayed += 1;
                    if vectors.len() == batch {
                        insert(&vectors)?;
                        vectors.clear();
                    }
                }
                Ok(_) => {}
                Err(why) => {
                    let document = stored_document_id(searcher, address)
                        .unwrap_or_else(|| format!("at segment {segment_ord} position {doc}"));
                    integrity.record(format!("document `{document}`: {why}"));
                }
            }
        }
    }
    if !vectors.is_empty() {
        insert(&vectors)?;
    }
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use super::super::handle::CollectionIndex;
    use super::super::records::{section_key, WriteOp};
    use super::super::testing::{document, open_dense, vector_bytes, write_and_wait};
    use super::*;
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

    /// Asserts that `vectors` vectors are live, one for each visible section, and that the
    /// nearest to `query` is the section `key`.
    fn assert_every_section_has_its_vector(
        index: &CollectionIndex,
        vectors: u64,
        query: [f32; 4],
        key: u64,
    ) {
        let every_section = DenseStats {
            vectors,
            sections_with_vector: vectors,
        };
        assert_eq!(dense_stats(index), every_section);
        assert_eq!(nearest(index, query)[0], key);
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

        // Loaded at open (the clean close sealed the live segment), the live sections only.
        let reopened = open_dense(&path, 4).unwrap();
        assert_eq!(dense_stats(&reopened), one);
        assert_eq!(nearest(&reopened, [0.0, 0.0, 1.0, 0.0]), [a_new]);
        assert!(!nearest(&reopened, [0.0, 1.0, 0.0, 0.0]).contains(&b));
        let counters = reopened.dense_counters().unwrap();
        assert_eq!((counters.inserted, counters.loaded_segments), (0, 1));
    }

    /// Three documents with vectors along the first three axes, closed cleanly (one sealed
    /// segment), in `<dir>/index`.
    fn sealed_collection(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("index");
        let index = open_dense(&path, 4).unwrap();
        write_and_wait(
            &index,
            vec![
                with_vector("a", 1, [1.0, 0.0, 0.0, 0.0]),
                with_vector("b", 1, [0.0, 1.0, 0.0, 0.0]),
                with_vector("c", 1, [0.0, 0.0, 1.0, 0.0]),
            ],
        );
        drop(index);
        path
    }

    #[test]
    fn a_replay_hands_over_each_wanted_vector_once_a_batch_at_a_time() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open_dense(&data_dir.path().join("index"), 4).unwrap();
        let docs = ["a", "b", "c", "d", "e"];
        let ops = docs
            .iter()
            .zip(1u8..)
            .map(|(doc, i)| with_vector(doc, 1, [f32::from(i), 1.0, 0.0, 0.0]))
            .collect();
        write_and_wait(&index, ops);
        // Every section but e's is wanted.
        let wanted: HashSet<u64> = docs[..4].iter().map(|doc| section_key(doc, 0, 1)).collect();
        let mut batches: Vec<Vec<u64>> = Vec::new();
        let integrity = Integrity::opening("replay");
        let replayed = replay_stored_vectors(
            &index.snapshot(),
            &index.fields,
            4,
            &wanted,
            &integrity,
            3,
            |vectors| {
                batches.push(vectors.iter().map(|(key, _)| *key).collect());
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(replayed, 4);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [3, 1]);
        let handed: HashSet<u64> = batches.concat().into_iter().collect();
        assert_eq!(handed, wanted);
        assert_eq!(integrity.damage(), None);
    }

    #[test]
    fn a_clean_open_inserts_nothing_and_after_a_crash_only_later_writes_are_inserted() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = sealed_collection(data_dir.path());
        let index = open_dense(&path, 4).unwrap();
        assert_eq!(index.dense_counters().unwrap().inserted, 0);
        write_and_wait(&index, vec![with_vector("d", 1, [0.0, 0.0, 0.0, 1.0])]);
        // As after kill -9: the live segment (holding d) is never sealed.
        let copy = tempfile::tempdir().unwrap();
        for folder in ["index", "dense"] {
            let (from, to) = (data_dir.path().join(folder), copy.path().join(folder));
            std::fs::create_dir_all(&to).unwrap();
            for entry in std::fs::read_dir(&from).unwrap() {
                let entry = entry.unwrap();
                if entry.file_name() != ".tantivy-writer.lock" {
                    std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
                }
            }
        }
        drop(index);
        let crashed = open_dense(&copy.path().join("index"), 4).unwrap();
        let counters = crashed.dense_counters().unwrap();
        assert_eq!((counters.inserted, counters.loaded_segments), (1, 1));
        assert_every_section_has_its_vector(
            &crashed,
            4,
            [0.0, 0.0, 0.0, 1.0],
            section_key("d", 0, 1),
        );
    }

    #[test]
    fn an_open_that_finds_a_full_tier_merges_it_without_waiting_for_a_write() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = data_dir.path().join("index");
        // Four clean closes, each sealing a segment of one vector: a full tier, which no
        // commit saw (the fourth is sealed by the last close).
        let axes = [
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 1.0, 0.0],
            [0.0, 0.0, 0.0, 1.0],
        ];
        for (doc, axis) in ["a", "b", "c", "d"].into_iter().zip(axes) {
            let index = open_dense(&path, 4).unwrap();
            write_and_wait(&index, vec![with_vector(doc, 1, axis)]);
            drop(index);
        }
        let index = open_dense(&path, 4).unwrap();
        assert_eq!(index.dense_counters().unwrap().loaded_segments, 4);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while index.dense_counters().unwrap().merges == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no merge within 60 s of the open"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_every_section_has_its_vector(&index, 4, axes[3], section_key("d", 0, 1));
    }

    #[test]
    fn a_damaged_segment_file_is_detected_and_repaired_from_the_stored_vectors() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = sealed_collection(data_dir.path());
        let graph = data_dir.path().join("dense/seg-0.flat");
        let mut bytes = std::fs::read(&graph).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        std::fs::write(&graph, &bytes).unwrap();

        let index = open_dense(&path, 4).unwrap();
        let counters = index.dense_counters().unwrap();
        assert_eq!(counters.damaged_segments, 1);
        assert_eq!((counters.loaded_segments, counters.inserted), (0, 3));
        assert_every_section_has_its_vector(
            &index,
            3,
            [0.0, 1.0, 0.0, 0.0],
            section_key("b", 0, 1),
        );
        drop(index);
        // The repaired segment was sealed again at the clean close: the next open loads it.
        let again = open_dense(&path, 4).unwrap();
        let counters = again.dense_counters().unwrap();
        assert_eq!(
            (
                counters.damaged_segments,
                counters.loaded_segments,
                counters.inserted
            ),
            (0, 1, 0)
        );
        assert_eq!(
            nearest(&again, [0.0, 0.0, 1.0, 0.0])[0],
            section_key("c", 0, 1)
        );
    }
}
