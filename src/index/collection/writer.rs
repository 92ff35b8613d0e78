//! A collection's writer, run by the shared [`WriterPool`]: applies writes in order, commits
//! them in groups and swaps in the new snapshot.
//!
//! Atomicity: an upsert deletes the document's sections and adds the new ones between two commits,
//! and a batch is never split by a commit, so a query sees either the old or the new version of a
//! document, never a mix; a batch that fails part way is abandoned whole, with everything
//! uncommitted. Durability: a `wait` write is answered only after tantivy's commit (which fsyncs
//! the segment files and atomically replaces meta.json) and after the reader reloaded.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tantivy::indexer::IndexWriterOptions;
use tantivy::{Index, IndexReader, IndexWriter, Term};
use tokio::sync::oneshot;

use super::dense_upkeep::DenseUpkeep;
use super::first_segment::FirstWrite;
use super::records::WriteOp;
use super::schema::SectionFields;
use super::section_document::section_documents;
use super::snapshot::Snapshot;
use super::storage;
use super::writer_pool::{JobState, Permit, WriterJob, WriterPool};
use crate::error::{LatheError, Result};

/// tantivy's smallest indexing arena per thread.
const MIN_ARENA_BYTES_PER_THREAD: usize = 15_000_000;

/// What a collection's handle sends its writer.
pub enum WriterCommand {
    Apply {
        ops: Vec<WriteOp>,
        /// `Some` for a `wait` write: answered with the generation once durable and visible.
        done: Option<oneshot::Sender<Result<u64>>>,
        /// With replication: the log position of the last entry in `ops`, committed with them.
        log_position: Option<u64>,
    },
    /// Commit what is held, close the writer and finish; `done` is dropped once that is over.
    Shutdown { done: std::sync::mpsc::Sender<()> },
}

/// How the writers of every collection behave (from `[storage]` in the configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterSettings {
    /// Indexing arena of one open writer, in bytes, shared by its indexing threads (tantivy's
    /// minimum is 15 MB per thread).
    pub memory_bytes: usize,
    /// Indexing threads of one open writer.
    pub indexing_threads: usize,
    /// Writes without `wait` are committed within this long.
    pub commit_interval: Duration,
    /// An open writer with nothing to commit is closed after this long without writes.
    pub idle_close: Duration,
    /// Worker threads shared by every collection's writes and commits.
    pub threads: usize,
    /// Index writers open at once; past that, the least recently used idle one is closed.
    pub max_open_writers: usize,
    /// Niceness of the writer threads (and the tantivy threads they start): 0..=19.
    pub nice: i32,
}

/// The shared writer workers (one per catalog).
pub type CollectionWriterPool = WriterPool<CollectionWriter>;

/// One collection's writer, run by the shared [`WriterPool`]: applies writes in order, commits
/// them in groups (at once for `wait` writes, else within the commit interval) and swaps in the
/// new snapshot. Its tantivy `IndexWriter` (`indexing_threads` indexing threads, one merge
/// thread, the segment updater, an arena of `memory_bytes` and a file lock) is opened on the
/// first write and closed once the collection has been idle for `idle_close`, so an idle
/// collection costs no thread.
pub struct CollectionWriter {
    pub(super) collection: String,
    /// The index folder, named in storage errors.
    pub(super) path: PathBuf,
    pub(super) index: Index,
    pub(super) settings: WriterSettings,
    /// Open only while the collection is being written (and holds a pool permit meanwhile).
    pub(super) writer: Option<IndexWriter>,
    /// An empty collection's first write, held uncommitted without an `IndexWriter` (see
    /// [`FirstWrite`]).
    pub(super) first_write: Option<FirstWrite>,
    pub(super) reader: IndexReader,
    pub(super) fields: SectionFields,
    pub(super) snapshot: Arc<RwLock<Arc<Snapshot>>>,
    /// Present when the collection has a dense index.
    pub(super) dense: Option<DenseUpkeep>,
    /// See [`CollectionIndex::commit_seqlock`](crate::index::CollectionIndex::commit_seqlock).
    pub(super) commit_seqlock: Arc<AtomicU64>,
    /// `wait` writes applied but not yet committed.
    pub(super) waiters: Vec<oneshot::Sender<Result<u64>>>,
    /// When the oldest uncommitted write was applied.
    pub(super) dirty_since: Option<Instant>,
    /// When the last command arrived, for closing the writer once idle.
    pub(super) last_write: Instant,
    /// With replication: the log position of the last entry committed (shared with the
    /// collection's handle), kept in every commit's payload.
    pub(super) log_position: Arc<AtomicU64>,
    /// The log position of the last entry applied and not yet committed.
    pub(super) pending_log_position: Option<u64>,
}

/// The commit payload that holds a replicated collection's log position.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CommitPayload {
    pub log_position: u64,
}

impl CommitPayload {
    /// The log position in a commit's payload; 0 without one (a single-node collection).
    pub(super) fn log_position_of(payload: Option<&str>) -> u64 {
        payload
            .and_then(|payload| serde_json::from_str::<CommitPayload>(payload).ok())
            .map_or(0, |payload| payload.log_position)
    }

    /// The payload of a commit that keeps `log_position`; none for 0 (a single-node collection).
    fn json(log_position: u64) -> Option<String> {
        (log_position != 0).then(|| {
            serde_json::to_string(&CommitPayload { log_position }).expect("a number serializes")
        })
    }
}

impl WriterJob for CollectionWriter {
    type Command = WriterCommand;

    fn run(&mut self, commands: Vec<WriterCommand>, permit: &mut Permit<'_, Self>) -> JobState {
        let mut shutdown: Vec<std::sync::mpsc::Sender<()>> = Vec::new();
        if !commands.is_empty() {
            self.last_write = Instant::now();
        }
        // Group commit: everything queued since the last run is applied before committing.
        for command in commands {
            match command {
                WriterCommand::Apply {
                    ops,
                    done,
                    log_position,
                } => {
                    let applied = match self.take_first_write(ops) {
                        Ok(first) => {
                            self.hold_first_write(first, done);
                            true
                        }
                        Err(ops) => self.apply(ops, done, permit),
                    };
                    if let Some(position) = log_position.filter(|_| applied) {
                        self.pending_log_position = Some(position);
                    }
                }
                WriterCommand::Shutdown { done } => shutdown.push(done),
            }
        }
        let interval_passed = self
            .dirty_since
            .is_some_and(|since| since.elapsed() >= self.settings.commit_interval);
        let stopping = !shutdown.is_empty();
        if !self.waiters.is_empty() || interval_passed || (stopping && self.dirty_since.is_some()) {
            self.commit();
        }
        if stopping {
            // A clean stop seals the live dense segment unless it is small: the next open
            // inserts little.
            if let Some(dense) = &self.dense {
                dense.seal_at_close();
            }
            self.close_index_writer();
            return JobState {
                writer_open: false,
                wake_at: None,
                finished: true,
            };
        }
        if self.dirty_since.is_none() && self.last_write.elapsed() >= self.settings.idle_close {
            self.close_index_writer();
        }
        self.state()
    }

    fn close_writer(&mut self) -> JobState {
        if self.dirty_since.is_some() {
            self.commit();
        }
        self.close_index_writer();
        self.state()
    }
}

impl CollectionWriter {
    fn state(&self) -> JobState {
        let wake_at = match (self.dirty_since, &self.writer) {
            (Some(since), _) => Some(since + self.settings.commit_interval),
            (None, Some(_)) => Some(self.last_write + self.settings.idle_close),
            (None, None) => None,
        };
        JobState {
            writer_open: self.writer.is_some(),
            wake_at,
            finished: false,
        }
    }

    /// Opens the tantivy writer if it is closed (taking a pool permit first).
    fn ensure_index_writer(&mut self, permit: &mut Permit<'_, Self>) -> Result<()> {
        if self.writer.is_some() {
            return Ok(());
        }
        permit.acquire();
        // A large write is indexed on `indexing_threads` side by side (tantivy's indexing was
        // the one serial stage of a bulk upload), fewer when the arena cannot give each thread
        // tantivy's minimum; one merge thread, since many collections may have a writer open.
        let threads = self.settings.indexing_threads.clamp(
            1,
            (self.settings.memory_bytes / MIN_ARENA_BYTES_PER_THREAD).max(1),
        );
        let options = IndexWriterOptions::builder()
            .num_worker_threads(threads)
            .num_merge_threads(1)
            .memory_budget_per_thread(self.settings.memory_bytes / threads)
            .build();
        let writer = self
            .index
            .writer_with_options(options)
            .map_err(|e| storage::write_error(&self.collection, &self.path, e))?;
        tracing::debug!(collection = %self.collection, "index writer opened");
        self.writer = Some(writer);
        Ok(())
    }

    /// Closes the tantivy writer after its merges finished (uncommitted writes must have been
    /// committed or abandoned before).
    fn close_index_writer(&mut self) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        if let Err(error) = writer.wait_merging_threads() {
            tracing::warn!(collection = %self.collection, %error, "a merge failed while closing the index writer");
        }
        tracing::debug!(collection = %self.collection, "index writer closed");
    }

    /// Drops the tantivy writer and everything uncommitted after a failure, and answers every
    /// waiter with `error`. The next write opens a fresh writer, so it meets the real cause (a
    /// full disk, a read-only mount) again rather than a writer killed by the last one.
    fn abandon_uncommitted(&mut self, error: &LatheError) {
        drop(self.writer.take());
        self.first_write = None;
        if let Some(dense) = &mut self.dense {
            dense.discard_pending();
        }
        self.dirty_since = None;
        self.pending_log_position = None;
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(Err(error.for_another_caller()));
        }
    }

    /// Applies `ops` (uncommitted); `false` when that failed and everything uncommitted was
    /// abandoned.
    fn apply(
        &mut self,
        ops: Vec<WriteOp>,
        done: Option<oneshot::Sender<Result<u64>>>,
        permit: &mut Permit<'_, Self>,
    ) -> bool {
        let result = if ops.is_empty() {
            Ok(())
        } else {
            self.ensure_index_writer(permit)
                .and_then(|()| ops.into_iter().try_for_each(|op| self.apply_one(op)))
        };
        let Err(error) = result else {
            self.dirty_since.get_or_insert_with(Instant::now);
            if let Some(done) = done {
                self.waiters.push(done);
            }
            return true;
        };
        let error = self.cause_of_failed_write(error);
        tracing::error!(collection = %self.collection, %error, "applying a write failed, dropping uncommitted writes");
        // Drop the writer so that no half-applied batch can be committed later.
        self.abandon_uncommitted(&error);
        if let Some(done) = done {
            let _ = done.send(Err(error));
        }
        false
    }

    /// A writer whose indexing thread died (on a full disk, when its arena filled and it
    /// flushed a segment) answers every later write with "An index writer was killed"; the
    /// thread's own error comes back only when it is joined, which preparing a commit does.
    fn cause_of_failed_write(&mut self, error: LatheError) -> LatheError {
        if !matches!(
            error,
            LatheError::Index(tantivy::TantivyError::ErrorInThread(_))
        ) {
            return error;
        }
        let Some(writer) = self.writer.as_mut() else {
            return error;
        };
        match writer.prepare_commit() {
            // Never committed: the writer is dropped right after.
            Ok(_prepared) => error,
            Err(cause) => storage::write_error(&self.collection, &self.path, cause),
        }
    }

    fn apply_one(&mut self, op: WriteOp) -> Result<()> {
        let Some(writer) = &self.writer else {
            return Err(LatheError::internal(
                "a write was applied with no index writer open",
            ));
        };
        match op {
            WriteOp::Delete { doc_id } => {
                writer.delete_term(Term::from_field_text(self.fields.doc_id, &doc_id));
                if let Some(dense) = &mut self.dense {
                    dense.deleted(doc_id);
                }
            }
            WriteOp::Upsert(document) => {
                writer.delete_term(Term::from_field_text(self.fields.doc_id, &document.doc_id));
                let tantivy_documents = section_documents(&document, &self.fields)?;
                if let Some(dense) = &mut self.dense {
                    dense.upserted(&document);
                }
                for tantivy_document in tantivy_documents {
                    writer
                        .add_document(tantivy_document)
                        .map_err(|e| storage::write_error(&self.collection, &self.path, e))?;
                }
            }
        }
        Ok(())
    }

    /// `ops` as the first write of this empty collection (see [`first_segment`]) when nothing
    /// is uncommitted and they may be one. Else the ops to apply through the `IndexWriter`:
    /// `ops`, after those of a first write held uncommitted, if any.
    ///
    /// [`first_segment`]: super::first_segment
    fn take_first_write(
        &mut self,
        ops: Vec<WriteOp>,
    ) -> std::result::Result<FirstWrite, Vec<WriteOp>> {
        if let Some(held) = self.first_write.take() {
            return Err(held.into_ops().chain(ops).collect());
        }
        let empty = self.writer.is_none()
            && self.dirty_since.is_none()
            && self.reader.searcher().segment_readers().is_empty();
        if !empty || ops.is_empty() {
            return Err(ops);
        }
        FirstWrite::of(ops)
    }

    /// Holds `first` uncommitted, as [`CollectionWriter::apply`] holds a write.
    fn hold_first_write(&mut self, first: FirstWrite, done: Option<oneshot::Sender<Result<u64>>>) {
        self.first_write = Some(first);
        self.dirty_since.get_or_insert_with(Instant::now);
        self.waiters.extend(done);
    }

    /// Writes and commits the held first write as the index's one segment.
    fn commit_first_write(&mut self, first: FirstWrite) {
        if let Some(dense) = &mut self.dense {
            for document in &first.documents {
                dense.upserted(document);
            }
        }
        self.publish(|writer, log_position| {
            first
                .commit(
                    &writer.index,
                    &writer.fields,
                    CommitPayload::json(log_position),
                )
                .map_err(|error| match error {
                    LatheError::Index(error) => {
                        storage::write_error(&writer.collection, &writer.path, error)
                    }
                    other => other,
                })
        });
    }

    /// Commits what was applied, answers the waiters, and on failure drops the writer and the
    /// uncommitted writes (see [`CollectionWriter::abandon_uncommitted`]).
    fn commit(&mut self) {
        self.dirty_since = None;
        if let Some(first) = self.first_write.take() {
            return self.commit_first_write(first);
        }
        if self.writer.is_none() {
            // Closed writer: everything applied was committed (a sync waits for nothing).
            let generation = self
                .snapshot
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .generation;
            for waiter in self.waiters.drain(..) {
                let _ = waiter.send(Ok(generation));
            }
            return;
        }
        self.publish(|writer, log_position| match writer.writer.as_mut() {
            Some(index_writer) => commit_with_log_position(index_writer, log_position)
                .map_err(|e| storage::write_error(&writer.collection, &writer.path, e)),
            None => Err(LatheError::internal("no index writer to commit")),
        });
    }

    /// Commits through `commit_index` (given the log position to keep), brings the dense index
    /// and the snapshot up to it, answers the waiters; on failure drops the writer and the
    /// uncommitted writes (see [`CollectionWriter::abandon_uncommitted`]).
    fn publish(&mut self, commit_index: impl FnOnce(&mut Self, u64) -> Result<u64>) {
        // The sections these documents had before this commit, read from the last snapshot.
        let replaced_keys = match &self.dense {
            Some(dense) => dense.replaced_section_keys(&self.reader.searcher(), &self.fields),
            None => Vec::new(),
        };
        // Odd from here until the new snapshot is in place (or the commit failed).
        self.commit_seqlock.fetch_add(1, Ordering::SeqCst);
        let log_position = self
            .pending_log_position
            .unwrap_or_else(|| self.log_position.load(Ordering::SeqCst));
        let result = commit_index(self, log_position).and_then(|opstamp| {
            // Dense index first, then the new snapshot: a query never sees a section whose
            // vector is missing (stale neighbours are dropped by the tantivy lookup).
            if let Some(dense) = &mut self.dense {
                dense.apply(replaced_keys)?;
            }
            self.reader.reload()?;
            let snapshot = Arc::new(Snapshot::new(self.reader.searcher(), opstamp));
            *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = snapshot;
            Ok(opstamp)
        });
        self.commit_seqlock.fetch_add(1, Ordering::SeqCst);
        match result {
            Ok(generation) => {
                if let Some(position) = self.pending_log_position.take() {
                    self.log_position.store(position, Ordering::SeqCst);
                }
                tracing::debug!(generation, waiters = self.waiters.len(), "committed");
                for waiter in self.waiters.drain(..) {
                    let _ = waiter.send(Ok(generation));
                }
            }
            Err(error) => {
                tracing::error!(collection = %self.collection, %error, "commit failed, dropping uncommitted writes");
                self.abandon_uncommitted(&error);
            }
        }
    }
}

/// Commits, keeping a replicated collection's log position (non-zero) in the commit's payload:
/// the position is durable exactly when the writes up to it are.
fn commit_with_log_position(writer: &mut IndexWriter, log_position: u64) -> tantivy::Result<u64> {
    let Some(payload) = CommitPayload::json(log_position) else {
        return writer.commit();
    };
    let mut prepared = writer.prepare_commit()?;
    prepared.set_payload(&payload);
    prepared.commit()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{document, open, record, write_and_wait};
    use super::*;
    use crate::types::Filter;

    #[test]
    fn writes_wait_for_a_commit_and_replace_or_delete_whole_documents() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open(&data_dir.path().join("index")).unwrap();
        let (generation_before, seqlock_before) =
            (index.snapshot().generation, index.commit_seqlock());
        let hazards = record("a", "hazards in their line of sight");
        assert!(index
            .write(vec![WriteOp::Upsert(hazards)], false)
            .unwrap()
            .is_none());
        // Not committed yet (the commit interval is an hour): nothing of it is visible.
        let snapshot = index.snapshot();
        assert_eq!(snapshot.generation, generation_before);
        assert!(index.document_sections("a").unwrap().is_empty());

        // A `wait` write commits what came before it too, in one commit.
        let generation = write_and_wait(&index, vec![WriteOp::Upsert(record("b", "boats afloat"))]);
        assert!(generation > generation_before);
        assert_eq!(index.snapshot().generation, generation);
        assert_eq!(index.document_sections("a").unwrap(), [(0, 1)]);
        assert_eq!(index.commit_seqlock(), seqlock_before + 2);

        // An upsert replaces every section of the document; a delete removes them all.
        let replacement = document("a", 2, &["boats in the harbour", "calm water"]);
        write_and_wait(&index, vec![WriteOp::Upsert(replacement)]);
        assert_eq!(index.document_sections("a").unwrap(), [(0, 2), (1, 2)]);
        let snapshot = index.snapshot();
        let hazards = index.query_terms("hazards");
        assert!(index
            .search(&snapshot, &hazards, &Filter::default(), 8)
            .unwrap()
            .is_empty());
        write_and_wait(
            &index,
            vec![WriteOp::Delete {
                doc_id: "b".to_string(),
            }],
        );
        assert!(index.document_sections("b").unwrap().is_empty());
        let stats = index.stats().unwrap();
        assert_eq!((stats.documents, stats.sections), (1, 2));
        assert_eq!(index.commit_seqlock() % 2, 0);
    }
}
