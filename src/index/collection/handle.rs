//! One collection's coarse index, as the rest of Lathe holds it: a tantivy index on disk
//! (sections, see `schema` and `section_document`), its writer (run by the shared writer pool,
//! see `writer`), an atomically swapped read [`Snapshot`] (reads are in `reader`) and, with the
//! neural stage, a dense index of section vectors kept in step by the writer (`dense_upkeep`).
//!
//! Integrity (see `integrity`): the index lives in a [`VerifiedDirectory`], so every file is
//! checked against its footer checksum before tantivy reads it; a collection with a damaged file
//! opens *damaged*: it answers every read and write with DATA_LOSS naming the file, and serves
//! nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tantivy::{Index, IndexReader, ReloadPolicy};
use tokio::sync::oneshot;

use super::dense_upkeep::{open_dense_index, DenseUpkeep, SharedDenseIndex};
use super::integrity::{Integrity, VerifiedDirectory};
use super::records::WriteOp;
use super::schema::{self, SchemaVersion, SectionFields};
use super::snapshot::Snapshot;
use super::storage;
use super::writer::{
    CollectionWriter, CollectionWriterPool, CommitPayload, WriterCommand, WriterSettings,
};
use super::writer_pool::{SlotHandle, WriterPool};
use crate::dense::{DenseCounters, DenseError, DenseIndex, DenseIndexConfig, LoadedIndex};
use crate::error::{LatheError, Result};

pub struct CollectionIndex {
    pub(super) fields: SectionFields,
    snapshot: Arc<RwLock<Arc<Snapshot>>>,
    writer: SlotHandle<CollectionWriter>,
    path: PathBuf,
    /// Section vectors (when the neural stage is on); kept in step with the snapshot by the writer.
    pub(super) dense: Option<SharedDenseIndex>,
    /// See [`CollectionIndex::commit_seqlock`].
    commit_seqlock: Arc<AtomicU64>,
    /// The pool of a standalone index (see [`CollectionIndex::open_or_create`]); dropped after
    /// the writer finished.
    own_pool: Option<CollectionWriterPool>,
    /// What was found wrong with the collection's stored data (see [`CollectionIndex::damage`]).
    pub(super) integrity: Arc<Integrity>,
    /// See [`CollectionIndex::log_position`].
    log_position: Arc<AtomicU64>,
}

impl CollectionIndex {
    /// Opens the index in `path`, creating it when absent, with a private writer pool of one
    /// thread (for tools and tests that open one index; the server's catalog shares one pool
    /// among all collections, see [`CollectionIndex::open`]).
    pub fn open_or_create(
        path: &Path,
        writer_memory_bytes: usize,
        commit_interval: Duration,
        dense_dim: Option<usize>,
    ) -> Result<Self> {
        let dense = dense_dim.map(DenseIndexConfig::new);
        Self::open_or_create_with(path, writer_memory_bytes, commit_interval, dense)
    }

    /// [`CollectionIndex::open_or_create`] with the dense index's settings given whole.
    pub fn open_or_create_with(
        path: &Path,
        writer_memory_bytes: usize,
        commit_interval: Duration,
        dense: Option<DenseIndexConfig>,
    ) -> Result<Self> {
        let settings = WriterSettings {
            memory_bytes: writer_memory_bytes,
            indexing_threads: 1,
            commit_interval,
            idle_close: Duration::from_secs(60),
            threads: 1,
            max_open_writers: 1,
            nice: 0,
        };
        let pool = WriterPool::new(1, 1, "lathe-writer")
            .map_err(|e| LatheError::io("spawning the index writer thread", e))?;
        // `collections/<name>/index` in a data dir; any other folder names itself.
        let folder_name = |path: &Path| {
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let name = match path.parent() {
            Some(parent) if path.ends_with("index") => folder_name(parent),
            _ => folder_name(path),
        };
        let mut index = Self::open(path, &name, dense, &settings, &pool)?;
        index.own_pool = Some(pool);
        Ok(index)
    }

    /// Opens the index of collection `name` in `path`, creating it when absent; its writes are
    /// applied by `pool`, whose workers open a tantivy writer only while the collection is
    /// being written. `dense`: the dense index's settings when the neural stage is on; the dense index's sealed segments are loaded from [`dense_dir`] and checked against
    /// tantivy, the one source of truth (see `dense_upkeep`).
    pub fn open(
        path: &Path,
        name: &str,
        dense: Option<DenseIndexConfig>,
        settings: &WriterSettings,
        pool: &CollectionWriterPool,
    ) -> Result<Self> {
        std::fs::create_dir_all(path).map_err(|e| storage::io_write_error(name, path, &e))?;
        let integrity = Integrity::opening(name);
        let (opened, dense) = open_files(path, name, dense, &integrity);
        let (index, fields, reader) = opened?;
        integrity.opened();
        let metas = index.load_metas()?;
        let generation = metas.opstamp;
        let log_position = Arc::new(AtomicU64::new(CommitPayload::log_position_of(
            metas.payload.as_deref(),
        )));
        let first_snapshot = Snapshot::new(reader.searcher(), generation);
        let dense = match dense {
            None => None,
            Some(loaded) => {
                let loaded =
                    loaded.map_err(|e| LatheError::internal(format!("dense index: {e}")))?;
                Some(Arc::new(open_dense_index(
                    &first_snapshot,
                    &fields,
                    loaded,
                    &integrity,
                )?))
            }
        };
        let snapshot = Arc::new(RwLock::new(Arc::new(first_snapshot)));
        let commit_seqlock = Arc::new(AtomicU64::new(0));
        let writer = pool.register(CollectionWriter {
            collection: name.to_string(),
            path: path.to_path_buf(),
            index,
            settings: settings.clone(),
            writer: None,
            first_write: None,
            reader,
            fields,
            snapshot: Arc::clone(&snapshot),
            dense: dense.clone().map(|dense| {
                let upkeep = DenseUpkeep::new(dense);
                // What the open replayed may call for merges.
                upkeep.start_merge_if_due();
                upkeep
            }),
            commit_seqlock: Arc::clone(&commit_seqlock),
            waiters: Vec::new(),
            dirty_since: None,
            last_write: Instant::now(),
            log_position: Arc::clone(&log_position),
            pending_log_position: None,
        });
        Ok(Self {
            fields,
            snapshot,
            writer,
            path: path.to_path_buf(),
            dense,
            commit_seqlock,
            own_pool: None,
            integrity,
            log_position,
        })
    }

    /// Writes an empty index of today's schema into `path` and nothing else: what a new
    /// collection's folder is built with before it is renamed into place and opened
    /// ([`CollectionIndex::open`]). No writer is registered and no thread started.
    pub fn create_empty(path: &Path, name: &str) -> Result<()> {
        std::fs::create_dir_all(path).map_err(|e| storage::io_write_error(name, path, &e))?;
        open_verified_index(path, name, &Integrity::opening(name)).map(drop)
    }

    /// `Some(reason)` once this process found any of the collection's stored data failing
    /// verification: a new segment file when a commit or merge first opened it (reads go on from
    /// the last good snapshot; that commit failed), or a stored section read by a query (that
    /// document answers DATA_LOSS; others are served, each verified). The first finding, and how
    /// many more. `None` while everything read so far verified. (A file failing at open makes
    /// `open` fail: the catalog lists the collection as damaged.)
    pub fn damage(&self) -> Option<String> {
        self.integrity.damage()
    }

    /// The sequence number of a seqlock around commits: the writer makes it odd when a commit
    /// starts changing the dense index and even again once the new snapshot is in place. A query
    /// that read the same even value before taking its snapshot and after its last stage ran
    /// against one consistent state of both indexes; only such an answer may be cached under its
    /// generation.
    pub fn commit_seqlock(&self) -> u64 {
        self.commit_seqlock.load(Ordering::SeqCst)
    }

    /// What the dense index did since the collection opened (inserts, segments loaded or found
    /// damaged, seals, merges); `None` without the neural stage.
    pub fn dense_counters(&self) -> Option<DenseCounters> {
        self.dense.as_ref().map(|dense| dense.counters())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Before the collection's folder goes away (a delete): stops every later change to the
    /// dense index's files, once a seal or merge writing them has ended. Tantivy's writer needs
    /// no fence: it never creates a folder, so a commit after the rename fails harmlessly.
    pub fn close_files(&self) {
        if let Some(dense) = &self.dense {
            dense.close_files();
        }
    }

    /// Undoes [`Self::close_files`]: the delete was refused and the collection stays.
    pub fn reopen_files(&self) {
        if let Some(dense) = &self.dense {
            dense.reopen_files();
        }
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        // A poisoned lock only means a writer panicked mid-swap; the Arc inside is still whole.
        let guard = self
            .snapshot
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&guard)
    }

    /// Hands `ops` to the writer. Returns a receiver for the visible generation when `wait`.
    pub fn write(
        &self,
        ops: Vec<WriteOp>,
        wait: bool,
    ) -> Result<Option<oneshot::Receiver<Result<u64>>>> {
        let (done, receiver) = if wait {
            let (sender, receiver) = oneshot::channel();
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        self.submit(ops, done, None)?;
        Ok(receiver)
    }

    /// With replication: hands `ops`, the log entries up to `log_position`, to the writer,
    /// which commits them with that position (see [`CollectionIndex::log_position`]); the
    /// receiver answers once they are durable and visible.
    pub fn write_logged(
        &self,
        ops: Vec<WriteOp>,
        log_position: u64,
    ) -> Result<oneshot::Receiver<Result<u64>>> {
        let (done, receiver) = oneshot::channel();
        self.submit(ops, Some(done), Some(log_position))?;
        Ok(receiver)
    }

    fn submit(
        &self,
        ops: Vec<WriteOp>,
        done: Option<oneshot::Sender<Result<u64>>>,
        log_position: Option<u64>,
    ) -> Result<()> {
        self.writer
            .submit(WriterCommand::Apply {
                ops,
                done,
                log_position,
            })
            .map_err(|_| LatheError::Unavailable("the collection's writer has stopped".into()))
    }

    /// With replication: the log position of the last entry committed to this collection (kept
    /// in tantivy's commit payload, so durable with the writes; 0 for a single-node collection).
    /// An entry at or below it is already here.
    pub fn log_position(&self) -> u64 {
        self.log_position.load(Ordering::SeqCst)
    }

    /// Asks the writer to commit what it holds and stop; [`CollectionIndex::shutdown`] waits for
    /// it. Asking every collection first lets the pool's workers stop them side by side.
    pub fn begin_shutdown(&self) -> std::sync::mpsc::Receiver<()> {
        let (done, finished) = std::sync::mpsc::channel();
        // Refused when already stopped: `done` is dropped, so waiting returns at once.
        let _ = self.writer.submit(WriterCommand::Shutdown { done });
        finished
    }

    /// Stops the writer after committing what it holds.
    pub fn shutdown(&self) {
        // Returns when the writer drops `done` (after its last commit), whatever the outcome.
        let _ = self.begin_shutdown().recv();
    }
}

impl Drop for CollectionIndex {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where the dense index of the collection whose tantivy index is in `index_path` keeps its
/// sealed segments: `<collection>/dense` beside `<collection>/index` in a data dir, else a
/// `dense` folder inside the index folder.
pub fn dense_dir(index_path: &Path) -> PathBuf {
    match index_path.parent() {
        Some(collection) if index_path.ends_with("index") => collection.join("dense"),
        _ => index_path.join("dense"),
    }
}

/// What [`open_files`] opened: tantivy's index, its fields and its reader, and the dense index's
/// sealed segments when the neural stage is on.
type OpenedFiles = (
    Result<(Index, SectionFields, IndexReader)>,
    Option<std::result::Result<LoadedIndex, DenseError>>,
);

/// Opens the collection's files in `path`. The dense segments load (when `dense` is on) while
/// tantivy's files are verified: neither reads the other's; they are checked against each other
/// once both are open (`open_dense_index`).
fn open_files(
    path: &Path,
    name: &str,
    dense: Option<DenseIndexConfig>,
    integrity: &Arc<Integrity>,
) -> OpenedFiles {
    let dense_dir = dense_dir(path);
    std::thread::scope(|scope| {
        let loading = dense.map(|config| {
            let dense_dir = &dense_dir;
            scope.spawn(move || DenseIndex::load(dense_dir, config))
        });
        let opened = open_verified_index(path, name, integrity).and_then(|(index, fields)| {
            let reader = open_verified_reader(&index, name, integrity)?;
            Ok((index, fields, reader))
        });
        let dense = loading.map(|handle| {
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        (opened, dense)
    })
}

/// The tantivy index in `path` (created when absent, with today's schema) and its fields, its
/// analyzer registered. An index created before gaps were stored keeps its schema
/// ([`SchemaVersion::WithoutGaps`]: it serves and takes writes, and stores no gaps); an index of
/// any other schema is refused as written by another version.
fn open_verified_index(
    path: &Path,
    name: &str,
    integrity: &Arc<Integrity>,
) -> Result<(Index, SectionFields)> {
    let directory = storage::IndexDirectory::open(path)
        .map_err(|e| LatheError::internal(format!("opening {}: {e}", path.display())))?;
    let directory: Box<dyn tantivy::Directory> = Box::new(VerifiedDirectory::new(
        directory,
        path,
        Arc::clone(integrity),
    ));
    let exists = Index::exists(&*directory)
        .map_err(|e| storage::write_error(name, path, tantivy::TantivyError::from(e)))?;
    let (index, fields) = if exists {
        let index = Index::open(directory).map_err(|e| storage::write_error(name, path, e))?;
        let fields = [SchemaVersion::Current, SchemaVersion::WithoutGaps]
            .into_iter()
            .map(schema::build_schema_version)
            .find_map(|(schema, fields)| (index.schema() == schema).then_some(fields))
            .ok_or_else(|| LatheError::IncompatibleIndex {
                collection: name.to_string(),
                reason: format!(
                    "its index in {} has another schema: it was written by an earlier version \
                     of Lathe, without per-section checksums; delete the collection, create it \
                     again and upsert its documents",
                    path.display()
                ),
            })?;
        (index, fields)
    } else {
        let (schema, fields) = schema::build_schema();
        let index = Index::create(directory, schema, tantivy::IndexSettings::default())
            .map_err(|e| storage::write_error(name, path, e))?;
        (index, fields)
    };
    schema::register_analyzer(&index);
    Ok((index, fields))
}

/// The index's reader, reloaded by the writer only. Opening it opens every segment file, each
/// verified against its footer first: a damaged one refuses the open with DATA_LOSS naming it.
fn open_verified_reader(index: &Index, name: &str, integrity: &Integrity) -> Result<IndexReader> {
    let reader: std::result::Result<IndexReader, _> = index
        .reader_builder()
        .reload_policy(ReloadPolicy::Manual)
        .doc_store_cache_num_blocks(0)
        .try_into();
    match (reader, integrity.damage()) {
        (Ok(reader), None) => Ok(reader),
        (_, Some(damage)) => Err(LatheError::DataLoss {
            collection: name.to_string(),
            documents: Vec::new(),
            detail: damage,
        }),
        (Err(error), None) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{document, open, write_and_wait, written_collection};
    use super::*;
    use crate::types::Filter;

    #[test]
    fn a_damaged_file_refuses_the_open_with_data_loss_naming_it() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = written_collection(data_dir.path());
        let postings = std::fs::read_dir(&path)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|file| file.extension().is_some_and(|e| e == "idx"))
            .unwrap();
        let mut damaged = std::fs::read(&postings).unwrap();
        damaged[0] ^= 0x20;
        std::fs::write(&postings, &damaged).unwrap();
        let file_name = postings.file_name().unwrap().to_string_lossy().into_owned();

        // Nothing of it is served (the catalog lists it damaged): a query would silently miss
        // the documents of the damaged segment.
        match open(&path).map(|_| ()) {
            Err(LatheError::DataLoss {
                collection,
                documents,
                detail,
            }) => {
                assert_eq!(collection, "wiki");
                assert!(documents.is_empty());
                assert!(
                    detail.starts_with(&format!("index file `{file_name}` fails its checksum")),
                    "{detail}"
                );
            }
            other => panic!("wanted DATA_LOSS, got {other:?}"),
        }
        // The damaged file stays as it was: nothing is repaired, removed or rewritten.
        assert_eq!(std::fs::read(&postings).unwrap(), damaged);
    }

    /// A collection created before gaps were stored keeps its schema: it opens, serves and
    /// takes writes (their gaps are not stored, so its sections are never joined), and the
    /// sections of a new index keep their gaps.
    #[test]
    fn an_index_from_before_gaps_opens_serves_and_takes_writes() {
        let data_dir = tempfile::tempdir().unwrap();
        let gapped = |doc_id: &str| {
            let mut record = document(doc_id, 1, &["hazards ahead", "boats afloat"]);
            record.sections[0].gap_after = "\n\n".into();
            record.sections[1].byte_start += 2;
            record.sections[1].char_start += 2;
            record
        };
        let stored_gaps = |index: &CollectionIndex| {
            let snapshot = index.snapshot();
            let terms = index.query_terms("hazards boats");
            let mut hits = index
                .search(&snapshot, &terms, &Filter::default(), 8)
                .unwrap();
            hits.sort_by_key(|hit| hit.ordinal);
            hits.into_iter()
                .map(|hit| (hit.text, hit.gap_after))
                .collect::<Vec<_>>()
        };

        let old = data_dir.path().join("collections/old/index");
        std::fs::create_dir_all(&old).unwrap();
        let (schema, _) = schema::build_schema_version(SchemaVersion::WithoutGaps);
        drop(Index::create_in_dir(&old, schema).unwrap());
        let index = open(&old).unwrap();
        write_and_wait(&index, vec![WriteOp::Upsert(gapped("a"))]);
        let expected = [
            ("hazards ahead".to_string(), String::new()),
            ("boats afloat".to_string(), String::new()),
        ];
        assert_eq!(stored_gaps(&index), expected);
        index.shutdown();
        let index = open(&old).unwrap();
        assert_eq!(stored_gaps(&index), expected, "after a reopen");
        index.shutdown();

        let new = data_dir.path().join("collections/new/index");
        let index = open(&new).unwrap();
        write_and_wait(&index, vec![WriteOp::Upsert(gapped("a"))]);
        assert_eq!(stored_gaps(&index)[0].1, "\n\n");
        index.shutdown();
    }

    #[test]
    fn an_index_written_with_another_schema_is_refused_clearly() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = data_dir.path().join("collections/old/index");
        std::fs::create_dir_all(&path).unwrap();
        // The schema before section checksums, reduced to one field: any other schema is refused.
        let mut builder = tantivy::schema::Schema::builder();
        builder.add_text_field("doc_id", tantivy::schema::STRING | tantivy::schema::STORED);
        drop(Index::create_in_dir(&path, builder.build()).unwrap());
        match open(&path) {
            Err(LatheError::IncompatibleIndex { collection, reason }) => {
                assert_eq!(collection, "old");
                assert!(reason.contains("earlier version of Lathe"), "{reason}");
                assert!(reason.contains("delete the collection"), "{reason}");
            }
            Err(other) => panic!("wanted IncompatibleIndex, got {other}"),
            Ok(_) => panic!("an index with another schema opened"),
        }
    }
}
