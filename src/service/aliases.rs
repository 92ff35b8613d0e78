//! Aliases: create, switch, delete and list them, and [`Engine::resolve`], the one place a name a
//! call gives becomes the collection it acts on. A call resolves its name once, at its start, and
//! keeps that collection for all its work: a Retrieve runs every stage on the collection the alias
//! named when it began, and a write is queued for the collection the alias named when it was
//! acknowledged. The catalog keeps the aliases durably (`data_dir/aliases.json`) and serialises
//! their changes with collection creates and deletes; with replication a change goes through the
//! write log and every replica, this one included, applies it from there.

use std::sync::Arc;

use super::collections::{blocking, validate_collection_name};
use super::Engine;
use crate::error::{LatheError, Result};
use crate::index::AliasChange;
use crate::replication::Entry;
use crate::types::Alias;

/// The collection a call acts on, and the alias it was reached through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub collection: String,
    pub alias: Option<String>,
}

impl Target {
    /// `error` about the target collection, naming the alias too when it came through one.
    pub fn explain(&self, error: LatheError) -> LatheError {
        match (&self.alias, error) {
            (Some(alias), LatheError::CollectionNotFound { name }) => LatheError::NotFound(
                format!("collection `{name}`, which alias `{alias}` names, not found"),
            ),
            (_, error) => error,
        }
    }
}

impl Engine {
    /// The collection `name` names: the one the alias `name` names now, else `name` itself.
    pub(super) fn resolve(&self, name: &str) -> Target {
        match self.catalog.alias_target(name) {
            Some(collection) => Target {
                collection,
                alias: Some(name.to_string()),
            },
            None => Target {
                collection: name.to_string(),
                alias: None,
            },
        }
    }

    pub async fn create_alias(&self, alias: String, collection: String) -> Result<Alias> {
        self.set_alias(alias, collection, AliasChange::Create).await
    }

    /// Points the existing `alias` at `collection`, atomically for readers.
    pub async fn switch_alias(&self, alias: String, collection: String) -> Result<Alias> {
        self.set_alias(alias, collection, AliasChange::Switch).await
    }

    async fn set_alias(
        &self,
        alias: String,
        collection: String,
        change: AliasChange,
    ) -> Result<Alias> {
        validate_collection_name("alias", &alias)?;
        validate_collection_name("collection", &collection)?;
        if let Some(replication) = self.replication() {
            self.check_alias_change(&alias, &collection, change)?;
            let entry = Entry::AliasSet {
                alias: alias.clone(),
                collection: collection.clone(),
            };
            let position = replication.publish_alias(entry).await?;
            self.wait_for_token(&collection, position).await?;
        } else {
            let catalog = Arc::clone(&self.catalog);
            let (name, target) = (alias.clone(), collection.clone());
            blocking(move || catalog.set_alias(&name, &target, change)).await?;
        }
        tracing::info!(alias, collection, ?change, "alias set");
        Ok(Alias { alias, collection })
    }

    /// On a replica, the checks a single node's catalog makes, against what this replica has
    /// applied of the log.
    fn check_alias_change(&self, alias: &str, collection: &str, change: AliasChange) -> Result<()> {
        if self.catalog.entry(alias).is_ok() {
            return Err(LatheError::CollectionExists {
                name: alias.to_string(),
            });
        }
        if self.catalog.alias_target(collection).is_some() {
            return Err(LatheError::invalid(
                "collection",
                format!(
                    "`{collection}` is an alias; an alias names a collection, never another alias"
                ),
            ));
        }
        self.catalog.entry(collection)?;
        match (self.catalog.alias_target(alias), change) {
            (Some(existing), AliasChange::Create) => Err(LatheError::AliasExists {
                alias: alias.to_string(),
                collection: existing,
            }),
            (None, AliasChange::Switch) => {
                Err(LatheError::NotFound(format!("alias `{alias}` not found")))
            }
            _ => Ok(()),
        }
    }

    pub async fn delete_alias(&self, alias: String) -> Result<()> {
        validate_collection_name("alias", &alias)?;
        if let Some(replication) = self.replication() {
            let Some(collection) = self.catalog.alias_target(&alias) else {
                return Err(LatheError::NotFound(format!("alias `{alias}` not found")));
            };
            let position = replication
                .publish_alias(Entry::AliasDeleted {
                    alias: alias.clone(),
                })
                .await?;
            self.wait_for_token(&collection, position).await?;
        } else {
            let catalog = Arc::clone(&self.catalog);
            let name = alias.clone();
            blocking(move || catalog.delete_alias(&name)).await?;
        }
        tracing::info!(alias, "alias deleted");
        Ok(())
    }

    /// Every alias, by name.
    pub async fn list_aliases(&self) -> Result<Vec<Alias>> {
        Ok(self
            .catalog
            .aliases()
            .into_iter()
            .map(|(alias, collection)| Alias { alias, collection })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lexical engine over a fresh data dir, with collections `v1` and `v2` and `live` → `v1`.
    async fn engine_with_alias(data_dir: &std::path::Path) -> Engine {
        let mut config = crate::config::Config::default();
        config.storage.data_dir = data_dir.to_path_buf();
        config.models.dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        config.models.dense = crate::config::DenseModel::Off;
        config.server.cpu_threads = 1;
        let metrics = Arc::new(crate::telemetry::Metrics::new());
        let engine = Engine::open(config, metrics).unwrap();
        for name in ["v1", "v2"] {
            engine
                .create_collection(name.into(), Default::default())
                .await
                .unwrap();
        }
        engine
            .create_alias("live".into(), "v1".into())
            .await
            .unwrap();
        engine
    }

    #[tokio::test]
    async fn a_call_that_resolved_an_alias_before_a_switch_and_a_delete_gets_the_new_collection() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine_with_alias(dir.path()).await;
        let stale = engine.resolve("live");
        assert_eq!(stale.collection, "v1");
        engine
            .switch_alias("live".into(), "v2".into())
            .await
            .unwrap();
        engine.delete_collection("v1").await.unwrap();
        let collection = engine.resolved_collection(&stale).await.unwrap();
        assert_eq!(collection.name, "v2");
        engine.shutdown();
    }

    #[test]
    fn a_collection_missing_behind_an_alias_is_named_with_the_alias() {
        let target = Target {
            collection: "v1".into(),
            alias: Some("live".into()),
        };
        let error = target.explain(LatheError::CollectionNotFound { name: "v1".into() });
        assert_eq!(
            error.to_string(),
            "collection `v1`, which alias `live` names, not found"
        );
        let direct = Target {
            collection: "v1".into(),
            alias: None,
        };
        assert_eq!(
            direct
                .explain(LatheError::CollectionNotFound { name: "v1".into() })
                .to_string(),
            "collection `v1` not found"
        );
    }
}
