//! The coarse index: collections on disk, each a tantivy index of sections (see `collection`),
//! and the catalog that creates, opens, lists and deletes them. Knows nothing of the pipeline or
//! of gRPC.

pub mod collection;
pub mod integrity;
pub mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use collection::{
    CollectionIndex, DocumentRecord, SectionHit, SectionRecord, Snapshot, WriteOp,
};

use crate::error::{LatheError, Result};

const SETTINGS_FILE: &str = "collection.json";
const INDEX_DIR: &str = "index";

/// Per-collection settings as persisted in `collection.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSettings {
    pub budget_tokenizer: String,
    pub section_tokens: u32,
    pub default_strategy: Option<String>,
    pub default_max_tokens: Option<u32>,
    pub default_overlap_tokens: Option<u32>,
}

/// An open collection: its settings and its index.
pub struct OpenCollection<T> {
    pub name: String,
    pub settings: StoredSettings,
    pub index: CollectionIndex,
    /// What the service attaches (tokenizer, ...).
    pub extra: T,
}

/// The collections under `data_dir/collections/`, each in a folder named after it.
pub struct Catalog<T> {
    root: PathBuf,
    writer_memory_bytes: usize,
    commit_interval: Duration,
    dense_dim: Option<usize>,
    collections: RwLock<BTreeMap<String, Arc<OpenCollection<T>>>>,
}

impl<T> Catalog<T> {
    /// Opens every collection found under `data_dir`; `attach` builds the service's part of each.
    pub fn open(
        data_dir: &Path,
        writer_memory_bytes: usize,
        commit_interval: Duration,
        dense_dim: Option<usize>,
        attach: impl Fn(&str, &StoredSettings) -> Result<T>,
    ) -> Result<Self> {
        let root = data_dir.join("collections");
        std::fs::create_dir_all(&root)
            .map_err(|e| LatheError::io(format!("creating {}", root.display()), e))?;
        let mut collections = BTreeMap::new();
        let entries = std::fs::read_dir(&root)
            .map_err(|e| LatheError::io(format!("listing {}", root.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| LatheError::io("listing collections", e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with('.') || !path.join(SETTINGS_FILE).exists() {
                // A half-created or half-deleted collection: it was never acknowledged.
                tracing::warn!(path = %path.display(), "removing an incomplete collection folder");
                let _ = std::fs::remove_dir_all(&path);
                continue;
            }
            let settings: StoredSettings = read_settings(&path)?;
            let index = CollectionIndex::open_or_create(
                &path.join(INDEX_DIR),
                writer_memory_bytes,
                commit_interval,
                dense_dim,
            )?;
            let extra = attach(&name, &settings)?;
            tracing::info!(collection = %name, generation = index.snapshot().generation, "opened collection");
            collections.insert(
                name.clone(),
                Arc::new(OpenCollection {
                    name,
                    settings,
                    index,
                    extra,
                }),
            );
        }
        Ok(Self {
            root,
            writer_memory_bytes,
            commit_interval,
            dense_dim,
            collections: RwLock::new(collections),
        })
    }

    pub fn get(&self, name: &str) -> Result<Arc<OpenCollection<T>>> {
        self.read()
            .get(name)
            .cloned()
            .ok_or_else(|| LatheError::CollectionNotFound {
                name: name.to_string(),
            })
    }

    pub fn list(&self) -> Vec<Arc<OpenCollection<T>>> {
        self.read().values().cloned().collect()
    }

    /// Creates a collection atomically: it is built in a hidden folder and renamed into place.
    pub fn create(
        &self,
        name: &str,
        settings: StoredSettings,
        extra: T,
    ) -> Result<Arc<OpenCollection<T>>> {
        let mut collections = self.collections.write().unwrap_or_else(|p| p.into_inner());
        if collections.contains_key(name) {
            return Err(LatheError::CollectionExists {
                name: name.to_string(),
            });
        }
        let staging = self.root.join(format!(".creating-{name}"));
        let target = self.root.join(name);
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .map_err(|e| LatheError::io("creating the collection folder", e))?;
        write_settings(&staging, &settings)?;
        // Create the empty index on disk before the rename, then open it in place.
        drop(CollectionIndex::open_or_create(
            &staging.join(INDEX_DIR),
            self.writer_memory_bytes,
            self.commit_interval,
            self.dense_dim,
        )?);
        std::fs::rename(&staging, &target)
            .map_err(|e| LatheError::io("publishing the collection folder", e))?;
        sync_dir(&self.root)?;
        let index = CollectionIndex::open_or_create(
            &target.join(INDEX_DIR),
            self.writer_memory_bytes,
            self.commit_interval,
            self.dense_dim,
        )?;
        let collection = Arc::new(OpenCollection {
            name: name.to_string(),
            settings,
            index,
            extra,
        });
        collections.insert(name.to_string(), Arc::clone(&collection));
        Ok(collection)
    }

    /// Deletes a collection: unlisted first, then its folder is renamed away and removed.
    pub fn delete(&self, name: &str) -> Result<()> {
        let removed = self
            .collections
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
            .ok_or_else(|| LatheError::CollectionNotFound {
                name: name.to_string(),
            })?;
        removed.index.shutdown();
        let target = self.root.join(name);
        let doomed = self.root.join(format!(".deleting-{name}"));
        std::fs::rename(&target, &doomed)
            .map_err(|e| LatheError::io("unpublishing the collection folder", e))?;
        sync_dir(&self.root)?;
        let _ = std::fs::remove_dir_all(&doomed);
        Ok(())
    }

    /// Commits and stops every collection's writer.
    pub fn shutdown(&self) {
        for collection in self.list() {
            collection.index.shutdown();
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<OpenCollection<T>>>> {
        self.collections.read().unwrap_or_else(|p| p.into_inner())
    }
}

fn read_settings(folder: &Path) -> Result<StoredSettings> {
    let path = folder.join(SETTINGS_FILE);
    let bytes = std::fs::read(&path)
        .map_err(|e| LatheError::io(format!("reading {}", path.display()), e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| LatheError::internal(format!("corrupt {}: {e}", path.display())))
}

fn write_settings(folder: &Path, settings: &StoredSettings) -> Result<()> {
    use std::io::Write;
    let path = folder.join(SETTINGS_FILE);
    let json =
        serde_json::to_vec_pretty(settings).map_err(|e| LatheError::internal(e.to_string()))?;
    let mut file = std::fs::File::create(&path)
        .map_err(|e| LatheError::io(format!("writing {}", path.display()), e))?;
    file.write_all(&json)
        .and_then(|()| file.sync_all())
        .map_err(|e| LatheError::io(format!("writing {}", path.display()), e))
}

fn sync_dir(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| LatheError::io(format!("syncing {}", path.display()), e))
}
