//! Writes on a replica (see `replication::work`): a write without `wait` is cut into sections
//! here, queued in the work stream and acknowledged; this replica's index worker, like every
//! other replica's, takes queued writes, embeds them and publishes their versions to the log. A
//! write with `wait` (or one with a document too large for a work message) is embedded here and
//! published directly, stamped so that it is ordered among the queued ones.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::collections::open_collection;
use super::ingestor::Ingestor;
use super::{Collection, CollectionRuntime, Engine};
use crate::cpu_pool::CpuPool;
use crate::error::{LatheError, Result};
use crate::index::{Catalog, DocumentRecord};
use crate::ingest::SectionedDocument;
use crate::replication::codec::{self, EncodedDocument};
use crate::replication::{Entry, Replication, VectorStamp, WorkItem, WORK_TOKEN};
use crate::types::{WriteOptions, WriteOutcome};
use crate::write_queue::QueuedWrite;

/// Text a work message carries at most (its documents' encoding): a large write is cut into
/// several, which workers of several replicas take side by side.
const WORK_PIECE_BYTES: usize = 128 << 10;

impl Engine {
    /// On a replica, upserts `sectioned`: queued for the index workers without `wait` (when
    /// every document fits a work message), else embedded here and published.
    pub(super) async fn replicate_upserts(
        &self,
        replication: &Arc<Replication>,
        collection: Arc<Collection>,
        sectioned: Vec<SectionedDocument>,
        options: WriteOptions,
    ) -> Result<WriteOutcome> {
        let documents = sectioned.len() as u32;
        let incarnation = collection.settings.log_created.unwrap_or(0);
        if !options.wait && self.config.replication.queue_writes && !sectioned.is_empty() {
            let max = replication.max_message_bytes().min(WORK_PIECE_BYTES);
            let pieces = self
                .pool
                .run(move || {
                    Ok((
                        QueuedWrite::encode_upsert_pieces(&sectioned, max),
                        sectioned,
                    ))
                })
                .await?;
            match pieces {
                (Some(pieces), _) => {
                    let token = replication
                        .queue_write(
                            &collection.name,
                            incarnation,
                            pieces,
                            &options.write_id,
                            self.config.ingest.max_queued_bytes_total,
                        )
                        .await?;
                    return Ok(WriteOutcome {
                        documents,
                        consistency_token: token,
                        ..WriteOutcome::default()
                    });
                }
                (None, back) => {
                    return self
                        .publish_here(replication, collection, back, options)
                        .await
                }
            }
        }
        self.publish_here(replication, collection, sectioned, options)
            .await
    }

    /// Takes a stamp, embeds `sectioned` here and publishes it (see the module doc).
    async fn publish_here(
        &self,
        replication: &Arc<Replication>,
        collection: Arc<Collection>,
        sectioned: Vec<SectionedDocument>,
        options: WriteOptions,
    ) -> Result<WriteOutcome> {
        let stamp = replication.claim_stamp().await?;
        let records = self
            .ingestor
            .embed_and_record(Arc::clone(&collection), sectioned)
            .await?;
        let outcome = WriteOutcome {
            documents: records.len() as u32,
            sections: records.iter().map(|r| r.sections.len() as u32).sum(),
            ..WriteOutcome::default()
        };
        let encoded = encode_upserts(&self.pool, &collection.name, records, self.vector_stamp());
        let token = replication
            .publish_documents(
                &collection.name,
                encoded.await?,
                &options.write_id,
                Some(stamp),
            )
            .await?;
        self.after_publish(&collection, token, &options, outcome)
            .await
    }

    /// Starts this replica's index worker (unless `replication.index_worker` is off).
    pub(super) fn start_index_worker(&self, replication: &Arc<Replication>) -> Option<WorkerTask> {
        if !self.config.replication.index_worker {
            return None;
        }
        let worker = IndexWorker {
            replication: Arc::clone(replication),
            catalog: Arc::clone(&self.catalog),
            ingestor: Arc::clone(&self.ingestor),
            pool: self.pool.clone(),
            vectors: self.vector_stamp(),
        };
        let (stop, stopped) = watch::channel(false);
        let handle = tokio::spawn(worker.run(stopped));
        Some(WorkerTask { stop, handle })
    }

    /// Waits until a work token's write is visible here (see `replication::work`).
    pub(super) async fn wait_for_work(&self, token: u64) -> Result<bool> {
        match self.replication() {
            Some(replication) if token >= WORK_TOKEN => {
                replication.wait_work_applied(token).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Entries of `records`, encoded on the pool.
async fn encode_upserts(
    pool: &CpuPool,
    collection: &str,
    records: Vec<DocumentRecord>,
    vectors: VectorStamp,
) -> Result<Vec<EncodedDocument>> {
    let name = collection.to_string();
    pool.run(move || {
        Ok(records
            .into_iter()
            .map(|record| EncodedDocument {
                doc_id: record.doc_id.clone(),
                bytes: codec::encode(Entry::Upsert {
                    collection: name.clone(),
                    record,
                    vectors: vectors.clone(),
                }),
            })
            .collect())
    })
    .await
}

/// The running index worker; [`WorkerTask::stop`] ends it after the write in hand.
pub(super) struct WorkerTask {
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl WorkerTask {
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }
}

/// Why a queued write was not applied this time.
enum Failure {
    /// It never can be (garbled, or its collection is gone): it leaves the queue.
    Drop(String),
    /// It may be later (the log or the model unavailable): it is delivered again.
    Retry(LatheError),
}

struct IndexWorker {
    replication: Arc<Replication>,
    catalog: Arc<Catalog<CollectionRuntime>>,
    ingestor: Arc<Ingestor>,
    pool: CpuPool,
    vectors: VectorStamp,
}

impl IndexWorker {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut pause = Duration::from_millis(250);
        let consumer = loop {
            tokio::select! {
                consumer = self.replication.work_consumer() => match consumer {
                    Ok(consumer) => break consumer,
                    Err(error) => tracing::debug!(%error, "the index worker waits for the work stream"),
                },
                _ = stop.wait_for(|stop| *stop) => return,
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        };
        tracing::info!("index worker taking queued writes");
        loop {
            let next = tokio::select! {
                next = self.replication.next_work(&consumer) => next,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            match next {
                Ok(Some(item)) => self.work(item).await,
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(%error, "the index worker could not pull a queued write");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Applies one queued write, telling JetStream it is in progress while it embeds.
    async fn work(&self, item: WorkItem) {
        let outcome = {
            let applying = self.apply(&item);
            tokio::pin!(applying);
            let mut beat = tokio::time::interval(crate::replication::work::WORK_ACK_WAIT / 3);
            beat.tick().await;
            loop {
                tokio::select! {
                    outcome = &mut applying => break outcome,
                    _ = beat.tick() => item.in_progress().await,
                }
            }
        };
        match outcome {
            Ok(()) => {
                if let Err(error) = item.done().await {
                    // Delivered again: its versions, already in the log, are not published twice.
                    tracing::warn!(collection = item.collection, %error, "a queued write was applied but its acknowledgement was lost");
                }
            }
            Err(Failure::Drop(why)) => {
                tracing::warn!(
                    collection = item.collection,
                    "a queued write is dropped: {why}"
                );
                item.drop_it().await;
            }
            Err(Failure::Retry(error)) => {
                let delay = Duration::from_secs(1 << item.delivered.clamp(1, 6));
                tracing::warn!(collection = item.collection, %error, retry_in_s = delay.as_secs(), "a queued write failed; it is tried again");
                item.retry_later(delay).await;
            }
        }
    }

    async fn apply(&self, item: &WorkItem) -> std::result::Result<(), Failure> {
        let write = QueuedWrite::decode(&item.payload)
            .map_err(|error| Failure::Drop(format!("it cannot be read: {error}")))?;
        // A write queued before the log was lost and recovered: the recovered log made every
        // collection again (new incarnations), so it goes to the collection of its name there.
        let Some(log) = self.replication.log_incarnation() else {
            return Err(Failure::Retry(LatheError::Unavailable(
                "this replica has not read its log yet".into(),
            )));
        };
        let recovered_since = item.log.as_ref().is_some_and(|then| *then != log);
        // The collection as the write found it: created here once the log is applied so far
        // (after a recovery, as far as the recovered log goes now).
        let applied = match recovered_since {
            false => {
                self.replication
                    .state()
                    .wait_applied(item.incarnation)
                    .await
            }
            true => self.replication.wait_head_applied().await,
        };
        applied.map_err(Failure::Retry)?;
        let collection = match open_collection(&self.catalog, &item.collection).await {
            Ok(collection) => collection,
            Err(LatheError::CollectionNotFound { .. }) => {
                return Err(Failure::Drop("its collection was deleted".into()))
            }
            Err(error) => return Err(Failure::Retry(error)),
        };
        if collection.settings.log_created != Some(item.incarnation) && !recovered_since {
            return Err(Failure::Drop(
                "its collection was deleted, and made again, since".into(),
            ));
        }
        let name = collection.name.clone();
        match write {
            QueuedWrite::Upsert(sectioned) => {
                let records = self
                    .ingestor
                    .embed_and_record(collection, sectioned)
                    .await
                    .map_err(Failure::Retry)?;
                let encoded = encode_upserts(&self.pool, &name, records, self.vectors.clone())
                    .await
                    .map_err(Failure::Retry)?;
                self.replication
                    .publish_documents(&name, encoded, "", Some(item.stamp))
                    .await
                    .map_err(Failure::Retry)?;
            }
            QueuedWrite::Delete(ids) => {
                self.replication
                    .publish_deletes(&name, &ids, "", item.stamp)
                    .await
                    .map_err(Failure::Retry)?;
            }
        }
        Ok(())
    }
}
