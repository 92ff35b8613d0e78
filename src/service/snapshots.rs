//! Snapshots and restores of collections (the catalog's `snapshots`), run off the async threads:
//! a snapshot reads every file of a commit and a restore writes and syncs them.

use std::io::Read;
use std::sync::Arc;

use super::collections::{blocking, validate_collection_name};
use super::{runtime_for, Engine};
use crate::error::{LatheError, Result};
use crate::index::CollectionEntry;
pub use crate::index::SnapshotInfo;
use crate::types::CollectionInfo;

/// A collection created from a snapshot.
pub struct Restored {
    pub collection: CollectionInfo,
    /// The collection the snapshot was taken of, and the generation it holds.
    pub source_collection: String,
    pub generation: u64,
    pub files: u64,
    pub bytes: u64,
}

impl Engine {
    /// Takes a snapshot of the collection's latest commit (of the collection an alias names, for
    /// an alias). It goes on to the end once started, even when the caller stops waiting.
    pub async fn create_snapshot(&self, collection: &str) -> Result<SnapshotInfo> {
        let target = self.resolve(collection);
        let catalog = Arc::clone(&self.catalog);
        let name = target.collection.clone();
        let started = std::time::Instant::now();
        let taken = blocking(move || catalog.create_snapshot(&name))
            .await
            .map_err(|error| target.explain(error))?;
        tracing::info!(
            collection,
            snapshot = %taken.info.name,
            generation = taken.info.generation,
            files = taken.files,
            bytes = taken.info.bytes,
            seconds = started.elapsed().as_secs_f64(),
            "snapshot taken"
        );
        Ok(taken.info)
    }

    pub async fn list_snapshots(&self, collection: &str) -> Result<Vec<SnapshotInfo>> {
        let catalog = Arc::clone(&self.catalog);
        let collection = (!collection.is_empty()).then(|| collection.to_string());
        blocking(move || catalog.list_snapshots(collection.as_deref())).await
    }

    pub async fn delete_snapshot(&self, collection: &str, name: &str) -> Result<()> {
        let catalog = Arc::clone(&self.catalog);
        let (collection, name) = (collection.to_string(), name.to_string());
        blocking(move || catalog.delete_snapshot(&collection, &name)).await
    }

    /// A snapshot this server keeps, open for reading, and its length.
    pub async fn open_snapshot(
        &self,
        collection: &str,
        name: &str,
    ) -> Result<(std::fs::File, u64)> {
        let path = self.catalog.snapshot_path(collection, name)?;
        let file = std::fs::File::open(&path)
            .map_err(|e| LatheError::io(format!("opening {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| LatheError::io(format!("reading {}", path.display()), e))?
            .len();
        Ok((file, len))
    }

    /// Creates collection `name` from the snapshot read from `input` (`label` names it in
    /// errors): all or nothing. Refused on a replica: its collections come from the log.
    pub async fn restore_snapshot(
        &self,
        name: String,
        label: String,
        input: Box<dyn Read + Send>,
    ) -> Result<Restored> {
        validate_collection_name("collection", &name)?;
        if self.replication().is_some() {
            return Err(LatheError::Precondition(
                "a replica's collections come from the replicated log, so a snapshot cannot be \
                 restored into one: restore it on a single node (see README, Backups)"
                    .into(),
            ));
        }
        let catalog = Arc::clone(&self.catalog);
        let models_dir = self.config.models.dir.clone();
        let started = std::time::Instant::now();
        let (collection, manifest) = blocking(move || {
            catalog.restore(&name, input, &label, |settings| {
                runtime_for(settings, &models_dir)
            })
        })
        .await?;
        let restored = Restored {
            collection: Self::info(&CollectionEntry::Ready(Arc::clone(&collection))),
            source_collection: manifest.collection,
            generation: manifest.generation,
            files: manifest.files.len() as u64,
            bytes: manifest.files.iter().map(|file| file.bytes).sum(),
        };
        tracing::info!(
            collection = %collection.name,
            from = %restored.source_collection,
            generation = restored.generation,
            bytes = restored.bytes,
            seconds = started.elapsed().as_secs_f64(),
            "collection restored from a snapshot"
        );
        Ok(restored)
    }
}
