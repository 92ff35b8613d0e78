//! Create, list, get and delete collections, and what they report.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{chunking_from_stored, runtime_for, Collection, CollectionRuntime, Engine};
use crate::error::{LatheError, Result};
use crate::index::{Catalog, CollectionEntry, FaultKind, StoredSettings};
use crate::query::validate::check_chunk_sizes;
use crate::replication::Entry;
use crate::types::{CollectionInfo, CollectionSettings, CollectionState};

impl Engine {
    pub async fn create_collection(
        &self,
        name: String,
        settings: CollectionSettings,
    ) -> Result<CollectionInfo> {
        validate_collection_name("name", &name)?;
        if settings.section_tokens == 0
            || settings.section_tokens > self.config.limits.max_chunk_tokens.max(65_536)
        {
            return Err(LatheError::invalid(
                "settings.section_tokens",
                format!(
                    "is {}; the allowed range is 1..=65536",
                    settings.section_tokens
                ),
            ));
        }
        let chunking = &settings.default_chunking;
        if chunking.max_tokens.is_some() || chunking.overlap_tokens.is_some() {
            let max_size = chunking
                .max_tokens
                .unwrap_or(self.config.retrieval.default_chunk_tokens);
            check_chunk_sizes(
                max_size,
                chunking.overlap_tokens.unwrap_or(0),
                self.config.limits.max_chunk_tokens,
            )
            .map_err(|e| match e {
                LatheError::InvalidArgument { field, reason } => {
                    LatheError::invalid(format!("settings.default_{field}"), reason)
                }
                other => other,
            })?;
        }
        let stored = StoredSettings {
            budget_tokenizer: if settings.budget_tokenizer.is_empty() {
                crate::tokenizer::DEFAULT_TOKENIZER.to_string()
            } else {
                settings.budget_tokenizer.clone()
            },
            section_tokens: settings.section_tokens,
            default_strategy: chunking.strategy.map(|s| s.name().to_string()),
            default_max_tokens: chunking.max_tokens,
            default_overlap_tokens: chunking.overlap_tokens,
            log_created: None,
        };
        let runtime = runtime_for(&stored, &self.config.models.dir)?;
        if let Some(replication) = self.replication() {
            // Every replica, this one included, creates it from the log.
            if self.catalog.entry(&name).is_ok() {
                return Err(LatheError::CollectionExists { name });
            }
            if let Some(collection) = self.catalog.alias_target(&name) {
                return Err(LatheError::AliasExists {
                    alias: name,
                    collection,
                });
            }
            let entry = Entry::CollectionCreated {
                name: name.clone(),
                settings: stored,
            };
            let position = replication.publish_collection_created(entry).await?;
            self.wait_for_token(&name, position).await?;
            return Ok(Self::info(&self.catalog.entry(&name)?));
        }
        let catalog = Arc::clone(&self.catalog);
        let collection = blocking(move || catalog.create(&name, stored, runtime)).await?;
        Ok(Self::info(&CollectionEntry::Ready(collection)))
    }

    /// Every collection, with the aliases naming it.
    pub async fn list_collections(&self) -> Result<Vec<CollectionInfo>> {
        let aliases = self.catalog.aliases();
        Ok(self
            .catalog
            .entries()
            .iter()
            .map(|entry| with_aliases(Self::info(entry), &aliases))
            .collect())
    }

    /// The collection `name` names (through an alias, the one the alias names), opened if it
    /// was closed, so that its statistics are today's.
    pub async fn get_collection(&self, name: &str) -> Result<CollectionInfo> {
        let target = self.resolve(name);
        let entry = open_entry(&self.catalog, &target.collection)
            .await
            .map_err(|error| target.explain(error))?;
        Ok(with_aliases(Self::info(&entry), &self.catalog.aliases()))
    }

    /// Deletes the collection; returns the delete's log position on a replica (every replica
    /// deletes it from the log; with it as a consistency token a read waits for that), else 0.
    /// Refused while an alias names it.
    pub async fn delete_collection(&self, name: &str) -> Result<u64> {
        let target = self.resolve(name);
        let name = target.collection.as_str();
        // A collection from before replication was on is this replica's alone: deleted here.
        let local_only = match self.catalog.entry(name) {
            Ok(entry) => entry
                .settings()
                .is_none_or(|settings| settings.log_created.is_none()),
            Err(_) => false,
        };
        if let (Some(replication), false) = (self.replication(), local_only) {
            self.catalog.check_unaliased(name)?;
            let position = replication.publish_collection_deleted(name).await?;
            self.wait_for_token(name, position).await?;
            return Ok(position);
        }
        let catalog = Arc::clone(&self.catalog);
        let owned = name.to_string();
        blocking(move || catalog.delete(&owned))
            .await
            .map_err(|error| target.explain(error))?;
        // Its queued writes go with it: they fail, and never reach a new collection of the name.
        self.ingestor.writable(name);
        if self.ingestor.queue.is_some() {
            let (name, reason) = (
                name.to_string(),
                format!("collection `{name}` was deleted before the write was applied"),
            );
            self.ingestor
                .queue_call(move |queue| queue.purge(&name, &reason))
                .await?;
        }
        Ok(0)
    }

    /// What List/GetCollection report of one collection; never fails, so that one collection
    /// cannot hide the others.
    pub(super) fn info(entry: &CollectionEntry<CollectionRuntime>) -> CollectionInfo {
        match entry {
            CollectionEntry::Ready(collection) => {
                let (state, reason, stats) = match collection.index.stats() {
                    // Damage found while serving: what verifies is still served (see `damage`).
                    Ok(stats) if collection.index.damage().is_some() => (
                        CollectionState::Damaged,
                        format!(
                            "{}; what verifies is still served, the rest answers DATA_LOSS",
                            collection.index.damage().unwrap_or_default()
                        ),
                        Some(stats),
                    ),
                    Ok(stats) => (CollectionState::Ready, String::new(), Some(stats)),
                    Err(error) => (
                        CollectionState::Damaged,
                        format!(
                            "{}: reading its statistics failed: {error}",
                            collection.index.path().display()
                        ),
                        None,
                    ),
                };
                CollectionInfo {
                    name: collection.name.clone(),
                    state,
                    reason,
                    settings: Some(settings_from_stored(&collection.settings)),
                    stats,
                    aliases: Vec::new(),
                }
            }
            // Ready as far as anyone knows: a fault found when it opens makes it faulted.
            CollectionEntry::Closed(closed) => CollectionInfo {
                name: closed.name.clone(),
                state: CollectionState::Ready,
                reason: String::new(),
                settings: Some(settings_from_stored(&closed.settings)),
                stats: closed.stats(),
                aliases: Vec::new(),
            },
            CollectionEntry::Faulted(faulted) => CollectionInfo {
                name: faulted.name.clone(),
                state: match faulted.fault.kind {
                    FaultKind::Damaged => CollectionState::Damaged,
                    FaultKind::Offline => CollectionState::Offline,
                },
                reason: faulted.fault.to_string(),
                settings: faulted.settings.as_ref().map(settings_from_stored),
                stats: None,
                aliases: Vec::new(),
            },
        }
    }
}

/// `info` with the aliases naming its collection, of `aliases` (alias → collection).
fn with_aliases(mut info: CollectionInfo, aliases: &BTreeMap<String, String>) -> CollectionInfo {
    info.aliases = aliases
        .iter()
        .filter(|(_, collection)| **collection == info.name)
        .map(|(alias, _)| alias.clone())
        .collect();
    info
}

fn settings_from_stored(stored: &StoredSettings) -> CollectionSettings {
    CollectionSettings {
        budget_tokenizer: stored.budget_tokenizer.clone(),
        default_chunking: chunking_from_stored(stored),
        section_tokens: stored.section_tokens,
    }
}

/// The collection name rule (aliases follow it too), `field` naming the request's field.
pub(super) fn validate_collection_name(field: &str, name: &str) -> Result<()> {
    if crate::index::is_valid_collection_name(name) {
        Ok(())
    } else {
        Err(LatheError::invalid(
            field,
            format!(
                "`{}` must be 1 to 64 characters of [A-Za-z0-9_-]",
                name.chars().take(80).collect::<String>()
            ),
        ))
    }
}

/// The entry of `name` with its index open (see `Catalog::open_entry`).
pub(super) async fn open_entry(
    catalog: &Arc<Catalog<CollectionRuntime>>,
    name: &str,
) -> Result<CollectionEntry<CollectionRuntime>> {
    opening(catalog, name, Catalog::open_entry).await
}

/// The open collection `name` (see `Catalog::get`), or why there is none to serve.
pub(super) async fn open_collection(
    catalog: &Arc<Catalog<CollectionRuntime>>,
    name: &str,
) -> Result<Arc<Collection>> {
    opening(catalog, name, Catalog::get).await
}

/// `work` for `name`, on a blocking thread when the collection is closed: its open reads and
/// verifies files, off the async threads.
async fn opening<R: Send + 'static>(
    catalog: &Arc<Catalog<CollectionRuntime>>,
    name: &str,
    work: fn(&Catalog<CollectionRuntime>, &str) -> Result<R>,
) -> Result<R> {
    if !matches!(catalog.entry(name)?, CollectionEntry::Closed(_)) {
        return work(catalog, name);
    }
    let (catalog, name) = (Arc::clone(catalog), name.to_string());
    blocking(move || work(&catalog, &name)).await
}

/// Runs blocking file-system work (fsyncs, renames) off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LatheError::internal(format!("blocking task failed: {e}")))?
}
