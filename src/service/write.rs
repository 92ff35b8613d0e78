//! Writes: upsert runs the stages of the ingest pipeline in order; delete and sync go straight to
//! the collection's writer. On a replica the records go to the write log instead, and every
//! replica (this one included) applies them from there (see `replica`).

use std::sync::Arc;
use std::time::Instant;

use super::Engine;
use crate::config::FineModeName;
use crate::embed::FineMode;
use crate::error::{LatheError, Result};
use crate::index::WriteOp;
use crate::ingest::embed::{EmbedIdentity, ReusableVectors};
use crate::ingest::section::SectionLimits;
use crate::ingest::{embed, records, section, sentences, validate, SentencedDocument};
use crate::replication::codec::{self, EncodedDocument};
use crate::replication::Entry;
use crate::types::{DocumentInput, WriteOutcome};

impl Engine {
    #[tracing::instrument(level = "debug", skip_all, fields(collection = %collection_name, documents = documents.len(), wait))]
    pub async fn upsert_documents(
        &self,
        collection_name: &str,
        documents: Vec<DocumentInput>,
        wait: bool,
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
        let limits = SectionLimits {
            section_tokens: collection.settings.section_tokens as usize,
            max_sections: self.config.limits.max_sections_per_document,
        };
        let sectioned_collection = Arc::clone(&collection);
        let sentenced = self
            .pool
            .run(move || {
                use rayon::prelude::*;
                let tokenizer = &sectioned_collection.extra.tokenizer;
                // Side by side when the pool has nothing else to do (see `cpu_pool::may_fan_out`).
                documents
                    .into_par_iter()
                    .with_min_len(crate::cpu_pool::min_split_len())
                    .map(|document| {
                        let sectioned = section::section(document, limits, tokenizer)?;
                        Ok(sentences::sentences(sectioned))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .await?;
        let records = self
            .embed_and_record(Arc::clone(&collection), sentenced)
            .await?;
        let outcome = WriteOutcome {
            documents: records.len() as u32,
            sections: records.iter().map(|r| r.sections.len() as u32).sum(),
            generation: 0,
            consistency_token: 0,
        };
        if self.replication().is_some() {
            return self
                .publish_upserts(&collection, records, wait, outcome)
                .await;
        }
        let ops = records.into_iter().map(WriteOp::Upsert).collect();
        let generation = await_write(collection.index.write(ops, wait)?).await?;
        Ok(WriteOutcome {
            generation,
            ..outcome
        })
    }

    /// On a replica: the records go to the log (encoded on the pool); with `wait`, the answer
    /// waits until this replica has applied them.
    async fn publish_upserts(
        &self,
        collection: &super::Collection,
        records: Vec<crate::index::DocumentRecord>,
        wait: bool,
        outcome: WriteOutcome,
    ) -> Result<WriteOutcome> {
        let Some(replication) = self.replication() else {
            return Err(LatheError::internal("publishing without replication"));
        };
        let name = collection.name.clone();
        let vectors = self.vector_stamp();
        let encoded = self
            .pool
            .run(move || {
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
            .await?;
        let token = replication
            .publish_documents(&collection.name, encoded)
            .await?;
        self.after_publish(collection, token, wait, outcome).await
    }

    /// The outcome of a write the log stored at `token`: with `wait`, once this replica applied
    /// it, with the generation that shows it.
    async fn after_publish(
        &self,
        collection: &super::Collection,
        token: u64,
        wait: bool,
        outcome: WriteOutcome,
    ) -> Result<WriteOutcome> {
        let mut outcome = WriteOutcome {
            consistency_token: token,
            ..outcome
        };
        if wait {
            self.wait_for_token(token).await?;
            outcome.generation = collection.index.snapshot().generation;
        }
        Ok(outcome)
    }

    /// The embed stage (with a model) and the records stage, on the pool. Before embedding, the
    /// stored sections of the documents' current versions are read: those whose embedding input
    /// is unchanged lend their vectors (see [`embed::ReusableVectors`]). A write waits (off the
    /// pool) for one of the embed stage's slots (see `ingest_inference_slots`); sectioning and
    /// committing of other writes go on meanwhile.
    async fn embed_and_record(
        &self,
        collection: Arc<super::Collection>,
        mut documents: Vec<SentencedDocument>,
    ) -> Result<Vec<crate::index::DocumentRecord>> {
        let embedder = self.embedder.clone();
        let mode = match self.config.models.fine_mode {
            FineModeName::Late => FineMode::LateChunking,
            FineModeName::Sentence => FineMode::PerSentence,
        };
        let model = self.config.models.dense.name();
        let metrics = Arc::clone(&self.metrics);
        let _slot = match embedder {
            Some(_) => Some(
                self.ingest_inference
                    .acquire()
                    .await
                    .map_err(|_| LatheError::Unavailable("the server is stopping".into()))?,
            ),
            None => None,
        };
        self.pool
            .run(move || {
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

    pub async fn delete_documents(
        &self,
        collection_name: &str,
        ids: Vec<String>,
        wait: bool,
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
        let documents = ids.len() as u32;
        if let Some(replication) = self.replication() {
            let token = replication.publish_deletes(&collection.name, &ids).await?;
            let outcome = WriteOutcome {
                documents,
                ..WriteOutcome::default()
            };
            return self.after_publish(&collection, token, wait, outcome).await;
        }
        let ops = ids
            .into_iter()
            .map(|doc_id| WriteOp::Delete { doc_id })
            .collect();
        let generation = await_write(collection.index.write(ops, wait)?).await?;
        Ok(WriteOutcome {
            documents,
            sections: 0,
            generation,
            consistency_token: 0,
        })
    }

    /// Makes what was written to the collection durable and visible; on a replica, waits until
    /// the writes up to `token` are applied here. Returns the generation that shows them.
    pub async fn sync(&self, collection_name: &str, token: u64) -> Result<u64> {
        let collection = self.collection_or_log(collection_name).await?;
        if self.replication().is_some() {
            self.wait_for_token(token).await?;
            return Ok(collection.index.snapshot().generation);
        }
        await_write(collection.index.write(Vec::new(), true)?).await
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

async fn await_write(receiver: Option<tokio::sync::oneshot::Receiver<Result<u64>>>) -> Result<u64> {
    match receiver {
        None => Ok(0),
        Some(receiver) => receiver.await.map_err(|_| {
            LatheError::Unavailable("the collection's writer stopped before committing".into())
        })?,
    }
}
