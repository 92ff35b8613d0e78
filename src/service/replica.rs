//! The service's side of replication (on when `replication.nats_url` is set): the applier that
//! turns log entries into collection changes on this replica, and the engine's calls that read
//! the log (a collection another replica created, a read after a consistency token). Once the
//! log is lost, an operator's recovery reads this replica's data through `ReplicaSeed` (a
//! re-seed), and every replica drops what the lost log made through `Applier::reset` before
//! applying the new one.
//!
//! Applying is exactly once per collection: an entry is applied only to the collection's
//! current incarnation (its position is above the collection's creating entry) and only once
//! (above the position the collection's last commit recorded, see
//! `CollectionIndex::log_position`). Document entries are grouped per collection and committed
//! with one `wait` write per collection per batch; a collection entry first commits what came
//! before it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::aliases::Target;
use super::collections::open_collection;
use super::{runtime_for, Collection, CollectionRuntime, Engine};
use crate::error::{LatheError, Result};
use crate::index::{Catalog, CollectionEntry, DocumentRecord, StoredSettings, WriteOp};
use crate::replication::{
    Applier, Entry, Positioned, Recovered, Recovery, Replication, Seed, VectorStamp,
};
use crate::telemetry::Metrics;

/// Applies log entries to this replica's catalog.
pub(super) struct ReplicaApplier {
    pub catalog: Arc<Catalog<CollectionRuntime>>,
    pub models_dir: std::path::PathBuf,
    /// This replica's model: entries whose vectors another model made cannot be applied.
    pub vectors: VectorStamp,
    pub metrics: Arc<Metrics>,
}

/// Document writes of one batch, per collection, waiting for their commit.
#[derive(Default)]
struct PendingWrites {
    by_collection: BTreeMap<String, (Arc<Collection>, Vec<WriteOp>, u64)>,
}

impl PendingWrites {
    fn push(&mut self, collection: Arc<Collection>, op: WriteOp, position: u64) {
        let pending = self
            .by_collection
            .entry(collection.name.clone())
            .or_insert_with(|| (collection, Vec::new(), position));
        pending.1.push(op);
        pending.2 = position;
    }

    /// Hands every collection its writes (they commit side by side), then waits for them all.
    fn commit(&mut self) -> Result<()> {
        let receivers = std::mem::take(&mut self.by_collection)
            .into_values()
            .map(|(collection, ops, position)| collection.index.write_logged(ops, position))
            .collect::<Result<Vec<_>>>()?;
        for receiver in receivers {
            receiver.blocking_recv().map_err(|_| {
                LatheError::Unavailable("a collection's writer stopped before committing".into())
            })??;
        }
        Ok(())
    }
}

impl Applier for ReplicaApplier {
    fn apply(&self, batch: &[Positioned]) -> Result<()> {
        let mut pending = PendingWrites::default();
        for Positioned { position, entry } in batch {
            let position = *position;
            match entry {
                Entry::CollectionCreated { name, settings } => {
                    pending.commit()?;
                    self.create(name, settings, position)?;
                }
                Entry::CollectionDeleted { name } => {
                    pending.commit()?;
                    self.delete(name, position)?;
                }
                Entry::Upsert {
                    collection,
                    record,
                    vectors,
                } => {
                    self.check_vectors(vectors, position)?;
                    if let Some(target) = self.target(collection, position) {
                        pending.push(target, WriteOp::Upsert(record.clone()), position);
                    }
                }
                Entry::Delete { collection, doc_id } => {
                    if let Some(target) = self.target(collection, position) {
                        let op = WriteOp::Delete {
                            doc_id: doc_id.clone(),
                        };
                        pending.push(target, op, position);
                    }
                }
                // Ordered after the writes before it, as a collection entry is.
                Entry::AliasSet { alias, collection } => {
                    pending.commit()?;
                    self.set_alias(alias, Some(collection), position)?;
                }
                Entry::AliasDeleted { alias } => {
                    pending.commit()?;
                    self.set_alias(alias, None, position)?;
                }
            }
        }
        pending.commit()
    }

    /// Deletes every collection the log made here (ready or not) and the aliases naming one, or
    /// naming none that exists; collections from before replication stay.
    fn reset(&self) -> Result<()> {
        let doomed: Vec<String> = self
            .catalog
            .entries()
            .iter()
            .filter(|entry| created_at(entry).is_some())
            .map(|entry| entry.name().to_string())
            .collect();
        for (alias, collection) in self.catalog.aliases() {
            if doomed.contains(&collection) || self.catalog.entry(&collection).is_err() {
                self.catalog.apply_alias(&alias, None)?;
            }
        }
        for name in &doomed {
            self.catalog.delete_even_if_aliased(name)?;
        }
        tracing::warn!(
            collections = doomed.len(),
            "dropped every collection the lost write log made here"
        );
        Ok(())
    }
}

/// This replica's data as a re-seed of the log reads it: the collections the log made here.
struct ReplicaSeed {
    catalog: Arc<Catalog<CollectionRuntime>>,
    vectors: VectorStamp,
}

impl Seed for ReplicaSeed {
    fn collections(&self) -> (Vec<(String, StoredSettings)>, Vec<String>) {
        let (mut readable, mut skipped) = (Vec::new(), Vec::new());
        for entry in self.catalog.entries() {
            let Some(settings) = entry.settings().filter(|s| s.log_created.is_some()) else {
                continue;
            };
            match &entry {
                CollectionEntry::Faulted(faulted) => skipped.push(format!(
                    "{}: {}",
                    faulted.name,
                    faulted.fault.error(&faulted.name)
                )),
                // A closed one opens when its documents are read.
                _ => readable.push((entry.name().to_string(), settings.clone())),
            }
        }
        (readable, skipped)
    }

    fn documents(
        &self,
        collection: &str,
        visit: &mut dyn FnMut(DocumentRecord) -> Result<()>,
    ) -> Result<()> {
        self.catalog
            .get(collection)?
            .index
            .for_each_stored_record(visit)
    }

    fn aliases(&self) -> Vec<(String, String)> {
        let (seeded, _) = self.collections();
        self.catalog
            .aliases()
            .into_iter()
            .filter(|(_, collection)| seeded.iter().any(|(name, _)| name == collection))
            .collect()
    }

    fn vectors(&self) -> VectorStamp {
        self.vectors.clone()
    }
}

impl ReplicaApplier {
    /// The collection a document entry at `position` applies to, or `None` (counted by why)
    /// when it applies to none here.
    fn target(&self, name: &str, position: u64) -> Option<Arc<Collection>> {
        let outcome = match self.catalog.open_entry(name) {
            Err(LatheError::CollectionNotFound { .. }) => Err("no_collection"),
            Err(_) | Ok(CollectionEntry::Faulted(_) | CollectionEntry::Closed(_)) => {
                Err("collection_unavailable")
            }
            Ok(CollectionEntry::Ready(collection)) => match collection.settings.log_created {
                None => Err("not_replicated"),
                Some(created) if position <= created => Err("earlier_incarnation"),
                Some(_) if position <= collection.index.log_position() => Err("already_applied"),
                Some(_) => Ok(collection),
            },
        };
        let label = match &outcome {
            Ok(_) => "applied",
            Err(why) => why,
        };
        self.metrics
            .replication
            .entries
            .with_label_values(&[label])
            .inc();
        outcome.ok()
    }

    /// Creates the collection at `position` (its incarnation) unless it is here already; an
    /// earlier incarnation here (deleted in the log meanwhile) is deleted first.
    fn create(&self, name: &str, settings: &StoredSettings, position: u64) -> Result<()> {
        match self.catalog.entry(name) {
            Err(LatheError::CollectionNotFound { .. }) => {}
            Err(error) => return Err(error),
            Ok(entry) => match created_at(&entry) {
                Some(created) if created >= position => return Ok(()),
                Some(_) => self.catalog.delete_even_if_aliased(name)?,
                None => {
                    tracing::error!(collection = name, position, "the log creates a collection that exists here from before replication was on; it is left as it is and the log's is not applied here");
                    return Ok(());
                }
            },
        }
        if self.catalog.alias_target(name).is_some() {
            tracing::error!(
                collection = name,
                position,
                "the log creates a collection of the name of an alias here; it is not applied here"
            );
            return Ok(());
        }
        let stored = StoredSettings {
            log_created: Some(position),
            ..settings.clone()
        };
        let runtime = runtime_for(&stored, &self.models_dir)?;
        self.catalog.create(name, stored, runtime)?;
        tracing::info!(
            collection = name,
            position,
            "collection created from the log"
        );
        Ok(())
    }

    /// Sets (or deletes) an alias as the log says. A name a collection of this replica's own
    /// holds (from before replication) keeps the collection, and the entry is passed over.
    fn set_alias(&self, alias: &str, collection: Option<&str>, position: u64) -> Result<()> {
        if self.catalog.entry(alias).is_ok() {
            tracing::error!(alias, position, "the log sets an alias of the name of a collection here; the alias is not applied here");
            return Ok(());
        }
        self.catalog.apply_alias(alias, collection)?;
        tracing::info!(alias, collection, position, "alias set from the log");
        Ok(())
    }

    /// Deletes the collection's incarnations older than the tombstone at `position` (whatever
    /// aliases name it here: the replica that published the delete checked its own).
    fn delete(&self, name: &str, position: u64) -> Result<()> {
        match self.catalog.entry(name) {
            Ok(entry) if created_at(&entry).is_some_and(|created| created < position) => {
                self.catalog.delete_even_if_aliased(name)?;
                tracing::info!(
                    collection = name,
                    position,
                    "collection deleted from the log"
                );
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Vectors of another model (or dimension) cannot go into this replica's indexes: a
    /// configuration error, which stops the apply loop (FAILED_PRECONDITION).
    fn check_vectors(&self, vectors: &VectorStamp, position: u64) -> Result<()> {
        if vectors.dim == 0 || *vectors == self.vectors {
            return Ok(());
        }
        Err(LatheError::Precondition(format!(
            "entry {position} carries {}-dimension vectors of model `{}`, this replica runs `{}` ({} dimensions): every replica must run the same models.dense",
            vectors.dim, vectors.model, self.vectors.model, self.vectors.dim
        )))
    }
}

/// The log position that created the collection here; `None` for one from before replication.
fn created_at(entry: &CollectionEntry<CollectionRuntime>) -> Option<u64> {
    entry.settings()?.log_created
}

impl Engine {
    /// The replication link, when this server is a replica.
    pub(super) fn replication(&self) -> Option<&Arc<Replication>> {
        self.replication.get()
    }

    /// The collection `name`; on a replica, one the log holds but this replica has not applied
    /// yet is waited for (within the call's deadline).
    /// A name that is an alias gives the collection the alias names now.
    pub(super) async fn collection_or_log(&self, name: &str) -> Result<Arc<Collection>> {
        let target = self.resolve(name);
        self.resolved_collection(&target).await
    }

    /// [`Engine::collection_or_log`] for a name already resolved. A collection gone since an
    /// alias was resolved (switched, then the old collection deleted, in between) gives the
    /// collection the alias names now: the call sees the old collection or the new, never neither.
    pub(super) async fn resolved_collection(&self, target: &Target) -> Result<Arc<Collection>> {
        let found = self.collection_or_log_of(&target.collection).await;
        if let (Err(LatheError::CollectionNotFound { .. }), Some(alias)) = (&found, &target.alias) {
            let now = self.resolve(alias);
            if now != *target {
                return self
                    .collection_or_log_of(&now.collection)
                    .await
                    .map_err(|error| now.explain(error));
            }
        }
        found.map_err(|error| target.explain(error))
    }

    async fn collection_or_log_of(&self, name: &str) -> Result<Arc<Collection>> {
        match (
            open_collection(&self.catalog, name).await,
            self.replication(),
        ) {
            (Err(LatheError::CollectionNotFound { .. }), Some(replication)) => {
                let Some(position) = replication.collection_position(name).await? else {
                    return Err(LatheError::CollectionNotFound {
                        name: name.to_string(),
                    });
                };
                replication.state().wait_applied(position).await?;
                open_collection(&self.catalog, name).await
            }
            (found, _) => found,
        }
    }

    /// A write on a replica goes to a collection the log holds.
    pub(super) fn check_replicated(&self, collection: &Collection) -> Result<()> {
        if self.replication().is_none() || collection.settings.log_created.is_some() {
            return Ok(());
        }
        Err(LatheError::Precondition(format!(
            "collection `{}` was created before replication was on, so the write log does not hold it and no other replica has it; create a new collection and upsert its documents there",
            collection.name
        )))
    }

    /// Waits until a write's consistency `token` is visible to `collection`: on a replica,
    /// once it has applied the log up to it; on a single node, once the collection's writes
    /// queued up to it have left the queue.
    pub(super) async fn wait_for_token(&self, collection: &str, token: u64) -> Result<()> {
        if token == 0 || self.wait_for_work(token).await? {
            return Ok(());
        }
        match (self.replication(), &self.ingestor.queue) {
            (Some(replication), _) => replication.state().wait_applied(token).await,
            (None, Some(queue)) => {
                queue.wait_visible(collection, token).await;
                Ok(())
            }
            (None, None) => Err(LatheError::internal(
                "a single node without its write queue",
            )),
        }
    }

    /// Replaces this replica's lost write log by a new one, re-seeded from its data or empty (see
    /// `replication::recover`); every replica then applies the new log from its start.
    /// FAILED_PRECONDITION on a single node, or while the log is not lost.
    pub async fn recover_log(&self, recovery: Recovery, confirm: &str) -> Result<Recovered> {
        let Some(replication) = self.replication() else {
            return Err(LatheError::Precondition(
                "this server is a single node (replication.nats_url is not set): there is no write log to recover".into(),
            ));
        };
        let seed = Arc::new(ReplicaSeed {
            catalog: Arc::clone(&self.catalog),
            vectors: self.vector_stamp(),
        });
        replication.recover(recovery, seed, confirm).await
    }

    /// The position this replica has applied (0 on a single node).
    pub(super) fn applied_position(&self) -> u64 {
        self.replication()
            .map_or(0, |replication| replication.state().progress().applied)
    }
}
