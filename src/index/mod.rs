//! The coarse index: collections on disk, each a tantivy index of sections (see `collection`),
//! and the catalog that creates, opens, lists and deletes them. Knows nothing of the pipeline or
//! of gRPC.

pub mod collection;
mod parallel;
pub mod schema;
pub mod storage;
pub mod writer_pool;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

pub use collection::{
    CollectionIndex, CollectionWriterPool, DocumentRecord, SectionHit, SectionRecord, Snapshot,
    WriteOp, WriterSettings,
};

use crate::error::{LatheError, Result};

const SETTINGS_FILE: &str = "collection.json";
const INDEX_DIR: &str = "index";
/// Collections opened at once at start.
const OPEN_THREADS: usize = 8;

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
    writer_settings: WriterSettings,
    dense_dim: Option<usize>,
    collections: RwLock<BTreeMap<String, Arc<OpenCollection<T>>>>,
    /// Applies every collection's writes (declared last: dropped after the collections).
    writer_pool: CollectionWriterPool,
}

impl<T> Catalog<T> {
    /// Opens every collection found under `data_dir` (several at once); `attach` builds the
    /// service's part of each.
    pub fn open(
        data_dir: &Path,
        writer_settings: WriterSettings,
        dense_dim: Option<usize>,
        attach: impl Fn(&str, &StoredSettings) -> Result<T> + Sync,
    ) -> Result<Self>
    where
        T: Send,
    {
        let root = data_dir.join("collections");
        std::fs::create_dir_all(&root)
            .map_err(|e| LatheError::io(format!("creating {}", root.display()), e))?;
        let writer_pool = CollectionWriterPool::new(
            writer_settings.threads,
            writer_settings.max_open_writers,
            "lathe-writer",
        )
        .map_err(|e| LatheError::io("spawning the index writer threads", e))?;
        let mut found = Vec::new();
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
            found.push((name, path));
        }
        // Opening reads every index's metadata and rebuilds its dense graph: mostly waiting on
        // the disk for many small collections, so a few at a time, whatever the core count.
        let opened = parallel::map_in_parallel(found, OPEN_THREADS, |(name, path)| -> Result<_> {
            let settings: StoredSettings = read_settings(&path)?;
            let index = CollectionIndex::open(
                &path.join(INDEX_DIR),
                &name,
                dense_dim,
                &writer_settings,
                &writer_pool,
            )?;
            let extra = attach(&name, &settings)?;
            tracing::info!(collection = %name, generation = index.snapshot().generation, "opened collection");
            Ok(OpenCollection {
                name,
                settings,
                index,
                extra,
            })
        });
        let mut collections = BTreeMap::new();
        for collection in opened {
            let collection = collection?;
            collections.insert(collection.name.clone(), Arc::new(collection));
        }
        Ok(Self {
            root,
            writer_settings,
            dense_dim,
            collections: RwLock::new(collections),
            writer_pool,
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
        drop(CollectionIndex::open(
            &staging.join(INDEX_DIR),
            name,
            self.dense_dim,
            &self.writer_settings,
            &self.writer_pool,
        )?);
        std::fs::rename(&staging, &target)
            .map_err(|e| LatheError::io("publishing the collection folder", e))?;
        sync_dir(&self.root)?;
        let index = CollectionIndex::open(
            &target.join(INDEX_DIR),
            name,
            self.dense_dim,
            &self.writer_settings,
            &self.writer_pool,
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

    /// Commits and stops every collection's writer (the pool's workers stop them side by side).
    pub fn shutdown(&self) {
        let collections = self.list();
        let stopping: Vec<_> = collections
            .iter()
            .map(|collection| collection.index.begin_shutdown())
            .collect();
        for stopped in stopping {
            let _ = stopped.recv();
        }
    }

    /// Index writers open now (each costs threads, a file lock and memory; see `WriterPool`).
    pub fn open_writers(&self) -> usize {
        self.writer_pool.open_writers()
    }

    /// Writers closed so far to make room for another collection's: rising steadily, it says
    /// more collections are written at once than `storage.max_open_writers`.
    pub fn writer_evictions(&self) -> u64 {
        self.writer_pool.evictions()
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
