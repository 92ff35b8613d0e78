//! The ingest stages as one runner, [`Ingestor`], shared by the accept path of a write and the
//! index workers that apply the write queue.
//!
//! On a single node a write is checked and cut into sections when it arrives (so bad input is
//! refused at once, whole), stored in the write queue and acknowledged; each collection with
//! writes waiting has one index worker (a task) that takes them in order: sentences, embed,
//! records, the index writer, then [`WriteQueue::finish`]. A worker ends when its collection's
//! queue is empty and the next write starts another. A failure of the disk or the writer is
//! retried (the write stays queued, nothing is lost); a failure no retry can mend (the collection
//! gone or damaged) fails the operation with its reason.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::CollectionRuntime;
use crate::config::{Config, FineModeName};
use crate::cpu_pool::CpuPool;
use crate::embed::{Embedder, FineMode};
use crate::error::{LatheError, Result, StorageFault};
use crate::index::{Catalog, DocumentRecord, OpenCollection, WriteOp};
use crate::ingest::embed::{EmbedIdentity, ReusableVectors};
use crate::ingest::section::SectionLimits;
use crate::ingest::{embed, records, section, sentences, SectionedDocument, SentencedDocument};
use crate::telemetry::Metrics;
use crate::types::DocumentInput;
use crate::write_queue::{QueuedWrite, WriteQueue};

type Collection = OpenCollection<CollectionRuntime>;

/// Calls into the queue's file at once (see `Ingestor::queue_calls`).
const QUEUE_CALLS: usize = 2;

/// A write with at most this many bytes of text is sectioned on the task that took it: under
/// 100 µs of work, less than a pool hop (rayon's threads spin through yields after each job).
const SECTION_INLINE_BYTES: usize = 4096;

/// How often ended operations and old write ids are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

pub(super) struct Ingestor {
    pub config: Config,
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Writes whose embed stage may run at once (see `ingest_inference_slots`).
    pub inference: tokio::sync::Semaphore,
    pub catalog: Arc<Catalog<CollectionRuntime>>,
    /// The queries' pool: a write's sectioning on the accept path, so it is acknowledged fast.
    pub pool: CpuPool,
    /// The background pool (`ingest.worker_nice`): sentences, embedding and records of
    /// writes, below the queries' priority.
    pub background: CpuPool,
    pub metrics: Arc<Metrics>,
    /// The write queue (a single node; `None` with replication).
    pub queue: Option<Arc<WriteQueue>>,
    /// Collections whose index worker is running.
    workers: Mutex<HashSet<String>>,
    /// Collections whose index the disk refuses (full, read-only, not writable), as the last try
    /// at applying a write found it: they take no new writes until a write applies again.
    refused: Mutex<HashMap<String, Refusal>>,
    /// Calls into the queue's file (blocking: a commit fsyncs) run on tokio's blocking threads,
    /// at most this many at once: the queue takes one write transaction at a time anyway, and
    /// a burst over many collections must not start a thread per worker.
    queue_calls: tokio::sync::Semaphore,
    /// Wakes workers waiting to retry: a write was refused, so the disk may have room again.
    retry_now: tokio::sync::Notify,
}

/// What the disk said when it refused a collection's write (see [`LatheError::Storage`]).
#[derive(Clone, Debug)]
struct Refusal {
    path: std::path::PathBuf,
    fault: StorageFault,
    cause: String,
}

impl Ingestor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: Config,
        embedder: Option<Arc<dyn Embedder>>,
        inference_slots: usize,
        catalog: Arc<Catalog<CollectionRuntime>>,
        pools: (CpuPool, CpuPool),
        metrics: Arc<Metrics>,
        queue: Option<Arc<WriteQueue>>,
    ) -> Self {
        Self {
            config,
            embedder,
            inference: tokio::sync::Semaphore::new(inference_slots),
            catalog,
            pool: pools.0,
            background: pools.1,
            metrics,
            queue,
            workers: Mutex::new(HashSet::new()),
            refused: Mutex::new(HashMap::new()),
            retry_now: tokio::sync::Notify::new(),
            queue_calls: tokio::sync::Semaphore::new(QUEUE_CALLS),
        }
    }

    /// The section stage of `documents`: here when small, else on the pool (side by side if idle).
    pub async fn section(
        &self,
        collection: &Arc<Collection>,
        documents: Vec<DocumentInput>,
    ) -> Result<Vec<SectionedDocument>> {
        let limits = SectionLimits {
            section_tokens: collection.settings.section_tokens as usize,
            max_sections: self.config.limits.max_sections_per_document,
        };
        if documents.iter().map(|d| d.text.len()).sum::<usize>() <= SECTION_INLINE_BYTES {
            let cut = |document| section::section(document, limits, &collection.extra.tokenizer);
            return documents.into_iter().map(cut).collect();
        }
        let collection = Arc::clone(collection);
        self.pool
            .run(move || {
                use rayon::prelude::*;
                let tokenizer = &collection.extra.tokenizer;
                documents
                    .into_par_iter()
                    .with_min_len(crate::cpu_pool::min_split_len())
                    .map(|document| section::section(document, limits, tokenizer))
                    .collect::<Result<Vec<_>>>()
            })
            .await
    }

    /// The sentences, embed (with a model) and records stages of `documents`, on the pool.
    /// Before embedding, the stored sections of the documents' current versions are read: those
    /// whose embedding input is unchanged lend their vectors (see [`embed::ReusableVectors`]). A
    /// write waits (off the pool) for one of the embed stage's slots.
    pub async fn embed_and_record(
        &self,
        collection: Arc<Collection>,
        documents: Vec<SectionedDocument>,
    ) -> Result<Vec<DocumentRecord>> {
        let embedder = self.embedder.clone();
        let mode = match self.config.models.fine_mode {
            FineModeName::Late => FineMode::LateChunking,
            FineModeName::Sentence => FineMode::PerSentence,
        };
        let model = self.config.models.dense.name();
        let metrics = Arc::clone(&self.metrics);
        let _slot = match embedder {
            Some(_) => Some(
                self.inference
                    .acquire()
                    .await
                    .map_err(|_| LatheError::Unavailable("the server is stopping".into()))?,
            ),
            None => None,
        };
        self.background
            .run(move || {
                let mut documents: Vec<SentencedDocument> =
                    documents.into_iter().map(sentences::sentences).collect();
                if let Some(embedder) = embedder {
                    let identity = EmbedIdentity { model, mode };
                    let reusable = ReusableVectors::from_stored(
                        identity,
                        embedder.dim(),
                        stored_embeddings(&collection.index, &documents),
                    );
                    let started = Instant::now();
                    let counts =
                        embed::embed(embedder.as_ref(), identity, &mut documents, &reusable)?;
                    if counts.embedded > 0 {
                        metrics.embedding_batches.with_label_values(&[model]).inc();
                        metrics
                            .embedding_batch_seconds
                            .with_label_values(&[model])
                            .observe(started.elapsed().as_secs_f64());
                    }
                    metrics
                        .embed_sections
                        .with_label_values(&["embedded"])
                        .inc_by(counts.embedded as u64);
                    metrics
                        .embed_sections
                        .with_label_values(&["reused"])
                        .inc_by(counts.reused as u64);
                }
                Ok(documents.into_iter().map(records::record).collect())
            })
            .await
    }

    /// Runs `call` on the queue off the async threads, within [`QUEUE_CALLS`].
    pub async fn queue_call<T: Send + 'static>(
        &self,
        call: impl FnOnce(&WriteQueue) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let queue = self
            .queue
            .clone()
            .ok_or_else(|| LatheError::internal("a write queue call on a server without one"))?;
        let _permit = self
            .queue_calls
            .acquire()
            .await
            .map_err(|_| LatheError::Unavailable("the server is stopping".into()))?;
        tokio::task::spawn_blocking(move || call(&queue))
            .await
            .map_err(|e| LatheError::internal(format!("write queue call failed: {e}")))?
    }

    /// Refuses a write to a collection whose index the disk refused at its last try, with the
    /// disk's error: a full disk stops the queue from taking writes, and loses none it holds.
    pub fn check_writable(&self, collection: &str) -> Result<()> {
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        match refused.get(collection) {
            None => Ok(()),
            Some(Refusal { path, fault, cause }) => {
                // The worker tries again at once: the next write finds out whether space is back.
                self.retry_now.notify_waiters();
                Err(LatheError::Storage {
                    collection: collection.to_string(),
                    path: path.clone(),
                    fault: *fault,
                    cause: cause.clone(),
                })
            }
        }
    }

    /// Forgets what the disk said of `collection` (a write applied, or the collection deleted).
    pub fn writable(&self, collection: &str) {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(collection);
    }

    /// Makes sure `collection` has an index worker (after a write was queued for it).
    pub fn ensure_worker(self: &Arc<Self>, collection: &str) {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        if workers.insert(collection.to_string()) {
            let ingestor = Arc::clone(self);
            let collection = collection.to_string();
            tokio::spawn(async move { ingestor.work(collection).await });
        }
    }

    /// Starts a worker for each collection with writes waiting, and the pruning of ended ops.
    pub fn start(self: &Arc<Self>) {
        let Some(queue) = &self.queue else {
            return;
        };
        for collection in queue.pending_collections() {
            self.ensure_worker(&collection);
        }
        let ingestor = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PRUNE_EVERY).await;
                let Some(ingestor) = ingestor.upgrade() else {
                    return;
                };
                let pruned = ingestor
                    .queue_call(|queue| queue.prune(SystemTime::now()))
                    .await;
                if let Err(error) = pruned {
                    tracing::warn!(%error, "pruning ended operations failed; trying again later");
                }
            }
        });
    }

    /// One collection's index worker: applies its queued writes in order, then ends.
    async fn work(self: Arc<Self>, collection: String) {
        let Some(queue) = self.queue.clone() else {
            return;
        };
        let mut backoff = Backoff::default();
        loop {
            let next = {
                let collection = collection.clone();
                self.queue_call(move |queue| queue.next(&collection)).await
            };
            let (id, write) = match next {
                Ok(Some(next)) => next,
                Ok(None) => {
                    let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
                    if queue.has_pending(&collection) {
                        continue;
                    }
                    workers.remove(&collection);
                    return;
                }
                Err(LatheError::Unavailable(_)) => return,
                Err(error) => {
                    tracing::error!(%collection, %error, "reading the write queue failed; retrying");
                    backoff.wait().await;
                    continue;
                }
            };
            let outcome = self.apply_until_done(&queue, &collection, id, write).await;
            let metrics = &self.metrics.write_queue;
            match &outcome {
                Ok(_) => metrics.operations.with_label_values(&["applied"]).inc(),
                Err(_) => metrics.operations.with_label_values(&["failed"]).inc(),
            }
            // The outcome must be recorded: retried until the queue file takes it.
            loop {
                let outcome = outcome.clone();
                match self
                    .queue_call(move |queue| queue.finish(id, outcome))
                    .await
                {
                    Ok(()) => break,
                    Err(LatheError::Unavailable(_)) => return,
                    Err(error) => {
                        tracing::error!(%collection, operation = id, %error, "recording an applied write failed; retrying");
                        backoff.wait().await;
                    }
                }
            }
            backoff = Backoff::default();
        }
    }

    /// Applies the write `id`, retrying what a retry can mend; `Err` is why it failed for good.
    async fn apply_until_done(
        &self,
        queue: &WriteQueue,
        collection: &str,
        id: u64,
        write: QueuedWrite,
    ) -> std::result::Result<(u32, u64), String> {
        let mut backoff = Backoff::default();
        loop {
            match self.apply(queue, collection, id, write.clone()).await {
                Ok(applied) => {
                    self.writable(collection);
                    return Ok(applied);
                }
                Err(error) if retryable(&error) => {
                    if queue.visible(collection, id) {
                        // Purged meanwhile: the collection was deleted.
                        return Err(error.to_string());
                    }
                    if let LatheError::Storage {
                        path, fault, cause, ..
                    } = &error
                    {
                        let refusal = Refusal {
                            path: path.clone(),
                            fault: *fault,
                            cause: cause.clone(),
                        };
                        self.refused
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(collection.to_string(), refusal);
                    }
                    queue.retrying(id, Some(error.to_string()));
                    tracing::warn!(%collection, operation = id, %error, "applying a queued write failed; it stays queued and is retried");
                    tokio::select! {
                        () = backoff.wait() => {}
                        () = self.retry_now.notified() => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(%collection, operation = id, %error, "a queued write failed");
                    return Err(error.to_string());
                }
            }
        }
    }

    /// One try at applying the write `id`: an upsert in parts of about `apply_batch_bytes`
    /// (progress after each; the last waits for the commit that makes all of it visible).
    async fn apply(
        &self,
        queue: &WriteQueue,
        collection_name: &str,
        id: u64,
        write: QueuedWrite,
    ) -> Result<(u32, u64)> {
        let collection =
            super::collections::open_collection(&self.catalog, collection_name).await?;
        if queue.visible(collection_name, id) {
            // Purged: the collection this write was queued for was deleted (the one found may
            // be a new one of the same name).
            return Err(LatheError::CollectionNotFound {
                name: collection_name.to_string(),
            });
        }
        let documents = match write {
            QueuedWrite::Delete(ids) => {
                let ops = ids
                    .into_iter()
                    .map(|doc_id| WriteOp::Delete { doc_id })
                    .collect();
                let generation = committed(collection.index.write(ops, true)?).await?;
                return Ok((0, generation));
            }
            QueuedWrite::Upsert(documents) => documents,
        };
        let part_bytes = self.config.ingest.apply_batch_bytes;
        let total = documents.len();
        let mut documents = documents.into_iter().peekable();
        let (mut done, mut bytes_done, mut sections) = (0u32, 0u64, 0u32);
        let mut generation = 0;
        while documents.peek().is_some() {
            let mut part = Vec::new();
            let mut part_size = 0u64;
            while let Some(document) =
                documents.next_if(|_| part.is_empty() || part_size < part_bytes)
            {
                part_size += (document.document.text.len() + document.document.title.len()) as u64;
                part.push(document);
            }
            let count = part.len() as u32;
            let records = self.embed_and_record(Arc::clone(&collection), part).await?;
            sections += records.iter().map(|r| r.sections.len() as u32).sum::<u32>();
            let last = done as usize + count as usize == total;
            let ops = records.into_iter().map(WriteOp::Upsert).collect();
            let receiver = collection.index.write(ops, last)?;
            if last {
                generation = committed(receiver).await?;
            }
            done += count;
            bytes_done += part_size;
            queue.progress(id, done, bytes_done);
            self.metrics
                .write_queue
                .applied_documents
                .inc_by(u64::from(count));
            self.metrics.write_queue.applied_bytes.inc_by(part_size);
        }
        Ok((sections, generation))
    }
}

/// Whether a failed apply may succeed later: the disk, the writer, the pool. A collection that
/// is gone, damaged or offline, or a write the index refuses, fails for good.
fn retryable(error: &LatheError) -> bool {
    matches!(
        error,
        LatheError::Storage { .. }
            | LatheError::StorageRefused { .. }
            | LatheError::Io { .. }
            | LatheError::Index(_)
            | LatheError::Unavailable(_)
            | LatheError::Overloaded(_)
    )
}

/// Waits 100 ms, doubling to 5 s.
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(100))
    }
}

impl Backoff {
    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
    }
}

/// The stored sections of the current version of each of `documents`, for reuse. A document
/// whose stored sections cannot be read (damaged) lends nothing: its new version is embedded
/// whole, and the upsert that replaces it goes ahead.
fn stored_embeddings(
    index: &crate::index::CollectionIndex,
    documents: &[SentencedDocument],
) -> Vec<crate::index::StoredEmbedding> {
    let mut stored = Vec::new();
    for document in documents {
        match index.document_embeddings(&document.document.id) {
            Ok(sections) => stored.extend(sections),
            Err(error) => tracing::warn!(
                document = %document.document.id,
                %error,
                "stored sections unreadable, embedding the new version whole"
            ),
        }
    }
    stored
}

/// The generation a waited write was committed at (0 when not waited for).
pub(super) async fn committed(
    receiver: Option<tokio::sync::oneshot::Receiver<Result<u64>>>,
) -> Result<u64> {
    match receiver {
        None => Ok(0),
        Some(receiver) => receiver.await.map_err(|_| {
            LatheError::Unavailable("the collection's writer stopped before committing".into())
        })?,
    }
}
