//! Writes. On a single node a write is checked, cut into sections, stored in the collection's
//! durable write queue and acknowledged with its operation; an index worker applies it after
//! (see `ingestor`), and `wait` waits until it is visible. On a replica the records go to the
//! write log instead, and every replica (this one included) applies them from there (see
//! `replica`).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::Engine;
use crate::error::{LatheError, Result};
use crate::ingest::validate;
use crate::types::{DocumentInput, Operation, OperationState, WriteOptions, WriteOutcome};
use crate::write_queue::{QueuedWrite, MAX_WRITE_ID_BYTES};

/// Longest `ListOperations` answer, and its default.
pub const MAX_LIST_OPERATIONS: usize = 1000;
const DEFAULT_LIST_OPERATIONS: usize = 100;

impl Engine {
    #[tracing::instrument(level = "debug", skip_all, fields(collection = %collection_name, documents = documents.len(), wait = options.wait))]
    pub async fn upsert_documents(
        &self,
        collection_name: &str,
        documents: Vec<DocumentInput>,
        options: WriteOptions,
    ) -> Result<WriteOutcome> {
        let collection = self
            .collection_or_log(collection_name)
            .await
            .map_err(|error| {
                let ids: Vec<String> = documents.iter().map(|d| d.id.clone()).collect();
                error.naming_documents(&ids)
            })?;
        self.check_replicated(&collection)?;
        validate::validate_batch(&self.config.limits, &documents)?;
        check_write_id(&options.write_id)?;
        let sectioned = self.ingestor.section(&collection, documents).await?;
        match self.replication() {
            Some(replication) => {
                self.replicate_upserts(replication, collection, sectioned, options)
                    .await
            }
            None => {
                self.enqueue(&collection.name, QueuedWrite::Upsert(sectioned), options)
                    .await
            }
        }
    }

    pub async fn delete_documents(
        &self,
        collection_name: &str,
        ids: Vec<String>,
        options: WriteOptions,
    ) -> Result<WriteOutcome> {
        let collection = self
            .collection_or_log(collection_name)
            .await
            .map_err(|error| error.naming_documents(&ids))?;
        self.check_replicated(&collection)?;
        if let Some(i) = ids.iter().position(String::is_empty) {
            return Err(LatheError::invalid(
                format!("ids[{i}]"),
                "must not be empty",
            ));
        }
        check_write_id(&options.write_id)?;
        let documents = ids.len() as u32;
        if let Some(replication) = self.replication() {
            // Stamped: ordered after every write queued before it (see `work`).
            let stamp = replication.claim_stamp().await?;
            let token = replication
                .publish_deletes(&collection.name, &ids, &options.write_id, stamp)
                .await?;
            let outcome = WriteOutcome {
                documents,
                ..WriteOutcome::default()
            };
            return self
                .after_publish(&collection, token, &options, outcome)
                .await;
        }
        self.enqueue(&collection.name, QueuedWrite::Delete(ids), options)
            .await
    }

    /// Stores `write` in the queue (durably, before answering), starts the collection's worker,
    /// and with `wait` waits until the write is visible, up to `options.wait_until`.
    async fn enqueue(
        &self,
        collection: &str,
        write: QueuedWrite,
        options: WriteOptions,
    ) -> Result<WriteOutcome> {
        self.queue()?;
        self.ingestor.check_writable(collection)?;
        let (documents, _) = write.size();
        let enqueued = {
            let (name, write_id) = (collection.to_string(), options.write_id.clone());
            self.ingestor
                .queue_call(move |queue| queue.enqueue(&name, &write, &write_id, SystemTime::now()))
                .await?
        };
        let id = enqueued.operation.id;
        if !enqueued.deduplicated {
            self.ingestor.ensure_worker(collection);
        } else {
            tracing::debug!(
                collection,
                operation = id,
                write_id = options.write_id,
                "a write id seen before: its first operation answers"
            );
        }
        let mut operation = enqueued.operation;
        if options.wait {
            operation = self
                .wait_operation_visible(collection, id, options.wait_until, &options.write_id)
                .await?;
        }
        Ok(WriteOutcome {
            documents,
            sections: operation.sections,
            generation: operation.generation,
            consistency_token: id,
            operation: Some(operation),
            operation_ids: vec![id],
        })
    }

    /// Waits until the write `id` is visible (until `until`): its operation once applied; the
    /// reason as an error if it failed; past `until`, [`LatheError::WriteQueued`].
    async fn wait_operation_visible(
        &self,
        collection: &str,
        id: u64,
        until: Option<Instant>,
        write_id: &str,
    ) -> Result<Operation> {
        let queue = self.queue()?;
        let started = Instant::now();
        let wait = queue.wait_visible(collection, id);
        let waited = match until {
            Some(until) => tokio::time::timeout_at(until.into(), wait).await.is_ok(),
            None => {
                wait.await;
                true
            }
        };
        if !waited {
            return Err(LatheError::WriteQueued {
                collection: collection.to_string(),
                operation_id: id,
                write_id: write_id.to_string(),
                waited: started.elapsed(),
            });
        }
        let operation = queue
            .operation(id)?
            .ok_or_else(|| LatheError::internal(format!("operation {id} has no record")))?;
        if operation.state == OperationState::Failed {
            return Err(LatheError::Precondition(format!(
                "operation {id} of collection `{collection}` failed: {}",
                operation.error
            )));
        }
        Ok(operation)
    }

    /// The write queue: a single node's.
    fn queue(&self) -> Result<Arc<crate::write_queue::WriteQueue>> {
        self.ingestor.queue.clone().ok_or_else(|| {
            LatheError::Precondition(
                "operations are a single node's: with replication a write is applied before it is acknowledged, and carries a consistency token instead"
                    .into(),
            )
        })
    }

    /// The operation `id`.
    pub async fn get_operation(&self, id: u64) -> Result<Operation> {
        self.queue()?;
        self.ingestor
            .queue_call(move |queue| queue.operation(id))
            .await?
            .ok_or_else(|| operation_not_found(id))
    }

    /// Up to `limit` (0: the default) operations of `collection`, newest first.
    pub async fn list_operations(&self, collection: &str, limit: u32) -> Result<Vec<Operation>> {
        let limit = match limit as usize {
            0 => DEFAULT_LIST_OPERATIONS,
            limit if limit <= MAX_LIST_OPERATIONS => limit,
            limit => {
                return Err(LatheError::invalid(
                    "limit",
                    format!("{limit} is out of range; the allowed range is 0..={MAX_LIST_OPERATIONS} (0: {DEFAULT_LIST_OPERATIONS})"),
                ))
            }
        };
        if collection.is_empty() {
            return Err(LatheError::invalid("collection", "must not be empty"));
        }
        self.queue()?;
        let name = self.resolve(collection).collection;
        self.ingestor
            .queue_call(move |queue| queue.operations(&name, limit))
            .await
    }

    /// Waits until the operation `id` ends or `timeout` passes; answers it as it stands then.
    pub async fn wait_operation(&self, id: u64, timeout: Option<Duration>) -> Result<Operation> {
        let queue = self.queue()?;
        let wait = queue.wait_ended(id);
        let ended = match timeout {
            Some(timeout) => tokio::time::timeout(timeout, wait).await.ok(),
            None => Some(wait.await),
        };
        match ended {
            Some(operation) => operation?.ok_or_else(|| operation_not_found(id)),
            None => self.get_operation(id).await,
        }
    }

    /// The outcome of a write the log stored at `token`: with `wait`, once this replica applied
    /// it, with the generation that shows it; past `options.wait_until`,
    /// [`LatheError::WriteStored`] with the token.
    pub(super) async fn after_publish(
        &self,
        collection: &super::Collection,
        token: u64,
        options: &WriteOptions,
        outcome: WriteOutcome,
    ) -> Result<WriteOutcome> {
        let mut outcome = WriteOutcome {
            consistency_token: token,
            ..outcome
        };
        if options.wait {
            let started = Instant::now();
            let wait = self.wait_for_token(&collection.name, token);
            let waited = match options.wait_until {
                Some(until) => tokio::time::timeout_at(until.into(), wait).await,
                None => Ok(wait.await),
            };
            let Ok(waited) = waited else {
                return Err(LatheError::WriteStored {
                    collection: collection.name.clone(),
                    token,
                    write_id: options.write_id.clone(),
                    waited: started.elapsed(),
                });
            };
            waited?;
            outcome.generation = collection.index.snapshot().generation;
        }
        Ok(outcome)
    }

    /// Makes what was written to the collection visible: on a single node, once every write
    /// queued for it so far is applied; on a replica, once the writes up to `token` are applied
    /// here. Returns the generation that shows them.
    pub async fn sync(&self, collection_name: &str, token: u64) -> Result<u64> {
        let collection = self.collection_or_log(collection_name).await?;
        self.wait_for_token(&collection.name, token).await?;
        if self.replication().is_some() {
            return Ok(collection.index.snapshot().generation);
        }
        super::ingestor::committed(collection.index.write(Vec::new(), true)?).await
    }
}

fn check_write_id(write_id: &str) -> Result<()> {
    if write_id.len() > MAX_WRITE_ID_BYTES {
        return Err(LatheError::invalid(
            "write_id",
            format!(
                "is {} bytes; the allowed range is 0..={MAX_WRITE_ID_BYTES}",
                write_id.len()
            ),
        ));
    }
    Ok(())
}

fn operation_not_found(id: u64) -> LatheError {
    LatheError::NotFound(format!(
        "operation {id} not found: never queued on this server, or ended longer ago than ingest.operations_retention_s"
    ))
}
