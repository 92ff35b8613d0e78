//! The catalog: the collections of a data dir, each in a folder of `data_dir/collections/`
//! named after it, created, opened (a few at a time, see `parallel`), listed and deleted as
//! described in the module doc of `index`. It stands on `collection` and is never imported by it.
//!
//! Files import one way, bottom up: `settings` (the name rule, [`StoredSettings`]), `fault`
//! ([`Fault`]) and `lock` first; `folders` (the layout, leftovers, the settings file) over
//! `settings` and `fault`; `entry` ([`CollectionEntry`]) over `settings`, `fault` and the
//! collection's handle; `opener` over those; `aliases` (the aliases and `aliases.json`) over
//! `settings` and `folders`; this file, the [`Catalog`], over all of them, and `residency`
//! (which collections are open) beside it, over `entry`.

mod aliases;
mod archive;
mod create;
mod entry;
mod fault;
mod folders;
pub mod lock;
mod opener;
mod parallel;
mod residency;
mod settings;
mod snapshots;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use aliases::AliasChange;
pub use archive::SnapshotManifest;
pub use entry::{ClosedCollection, CollectionEntry, FaultedCollection, OpenCollection};
pub use fault::{Fault, FaultKind};
pub use lock::DataDirLock;
pub use settings::{is_valid_collection_name, StoredSettings};
pub use snapshots::{extract_snapshot, SnapshotInfo, TakenSnapshot};

use aliases::AliasMap;
use folders::{collection_names, sync_dir, COLLECTIONS_DIR, DELETING_PREFIX};
use opener::{Attach, Opener};
use residency::{Closer, Listing, Residency};

use crate::dense::DenseIndexConfig;
use crate::error::{LatheError, Result};
use crate::index::collection::{CollectionWriterPool, WriterSettings};

/// The collections under `data_dir/collections/`, each in a folder named after it.
pub struct Catalog<T> {
    root: PathBuf,
    writer_settings: WriterSettings,
    dense: Option<DenseIndexConfig>,
    /// Every collection by name, and how many are open (see `residency`).
    residency: Arc<Residency<T>>,
    /// Closes idle collections past `storage.max_open_collections`.
    closer: Closer,
    /// Builds the service's part of a collection when it opens.
    attach: Box<Attach<T>>,
    /// Second names of collections (`data_dir/aliases.json`), in the collections' namespace.
    aliases: AliasMap,
    /// Serialises deletes and alias changes, so that each checks and changes the folders and the
    /// listing as one step while `entries` (which every call reads) is write-locked only for the
    /// moment of the change, never while folders are synced or writers stop. It holds the names
    /// being created (or restored): a create takes it only to check and reserve its name, and
    /// builds, syncs and opens its folder outside it, so creates run side by side.
    changing: Mutex<BTreeSet<String>>,
    /// Held from `open` until `shutdown`: no other server opens these collections meanwhile,
    /// which is also what makes a staging folder found at open a leftover of a dead process.
    lock: Mutex<Option<DataDirLock>>,
    /// Applies every collection's writes (declared last: dropped after the collections).
    writer_pool: CollectionWriterPool,
}

impl<T> Catalog<T> {
    /// Opens the collections found under `data_dir`: the first `max_open` by name (several at
    /// once), the rest listed closed with their settings read (see `residency`). `attach` builds
    /// the service's part of each as it opens, or says why it cannot (the collection is then
    /// listed as faulted). Only a collections folder that cannot be created or listed is an
    /// error: one collection never stops the rest.
    pub fn open(
        lock: DataDirLock,
        data_dir: &Path,
        writer_settings: WriterSettings,
        dense: Option<DenseIndexConfig>,
        max_open: usize,
        attach: impl Fn(&str, &StoredSettings) -> Result<T, Fault> + Send + Sync + 'static,
    ) -> Result<Self>
    where
        T: Send + Sync + 'static,
    {
        let root = data_dir.join(COLLECTIONS_DIR);
        snapshots::remove_snapshot_leftovers(data_dir);
        std::fs::create_dir_all(&root)
            .map_err(|e| LatheError::io(format!("creating {}", root.display()), e))?;
        // An alias naming a collection that is missing or faulted is kept: reads through it
        // answer that collection's error.
        let aliases = AliasMap::open(data_dir)?;
        let writer_pool = CollectionWriterPool::niced(
            writer_settings.threads,
            writer_settings.max_open_writers,
            "lathe-writer",
            writer_settings.nice,
        )
        .map_err(|e| LatheError::io("spawning the index writer threads", e))?;
        let opener = Opener {
            root: &root,
            writer_settings: &writer_settings,
            writer_pool: &writer_pool,
            dense: dense.clone(),
        };
        let entries = opener.open_at_start(collection_names(&root)?, max_open, &attach);
        let residency = Arc::new(Residency::new(entries, max_open));
        residency.check_map_limit();
        let closer = Closer::start(Arc::clone(&residency))?;
        Ok(Self {
            root,
            writer_settings,
            dense,
            residency,
            closer,
            attach: Box::new(attach),
            aliases,
            changing: Mutex::new(BTreeSet::new()),
            lock: Mutex::new(Some(lock)),
            writer_pool,
        })
    }

    fn opener(&self) -> Opener<'_> {
        Opener {
            root: &self.root,
            writer_settings: &self.writer_settings,
            writer_pool: &self.writer_pool,
            dense: self.dense.clone(),
        }
    }

    /// The open collection `name` (opened now if it was closed), or why there is none to serve.
    pub fn get(&self, name: &str) -> Result<Arc<OpenCollection<T>>> {
        match self.open_entry(name)? {
            CollectionEntry::Ready(open) => Ok(open),
            CollectionEntry::Faulted(faulted) => Err(faulted.fault.error(name)),
            CollectionEntry::Closed(_) => {
                Err(LatheError::internal("open_entry gave a closed collection"))
            }
        }
    }

    /// What the catalog holds for `name` now, open or not: opens nothing (see `open_entry`).
    pub fn entry(&self, name: &str) -> Result<CollectionEntry<T>> {
        self.read()
            .get(name)
            .cloned()
            .ok_or_else(|| LatheError::CollectionNotFound {
                name: name.to_string(),
            })
    }

    /// Every collection, open, closed or faulted, by name; opens nothing.
    pub fn entries(&self) -> Vec<CollectionEntry<T>> {
        self.read().values().cloned().collect()
    }

    /// Deletes a collection, ready or faulted, all or nothing: its folder is renamed away first,
    /// while the collection keeps serving; only once that rename is durable is it unlisted, its
    /// writer stopped and the folder removed. A refused rename changes nothing. Refused while an
    /// alias names it: deleting would break every reader of the alias.
    pub fn delete(&self, name: &str) -> Result<()> {
        let _changing = self.changing();
        if self.read().contains_key(name) {
            self.check_unaliased(name)?;
        }
        self.delete_changing(name)
    }

    /// [`Catalog::delete`] whatever aliases name the collection (they are kept, and reads through
    /// them answer NOT_FOUND): for a delete the write log already holds.
    pub fn delete_even_if_aliased(&self, name: &str) -> Result<()> {
        let _changing = self.changing();
        self.delete_changing(name)
    }

    fn delete_changing(&self, name: &str) -> Result<()> {
        loop {
            let entry = self.entry(name)?;
            let CollectionEntry::Closed(closed) = &entry else {
                return self.delete_entry(name, &entry);
            };
            // A closed collection may be opening (or still closing): wait for that to end.
            let _gate = closed.gate.lock().unwrap_or_else(|p| p.into_inner());
            if self.residency.holds(name, closed) {
                return self.delete_entry(name, &entry);
            }
        }
    }

    /// Deletes `entry`, what the listing holds for `name` (see [`Catalog::delete`]).
    fn delete_entry(&self, name: &str, entry: &CollectionEntry<T>) -> Result<()> {
        let target = self.root.join(name);
        let doomed = self.root.join(format!("{DELETING_PREFIX}{name}"));
        let refused = |action: String, path: &Path, source: std::io::Error| {
            tracing::warn!(collection = %name, path = %path.display(), %source, "delete refused by the filesystem; the collection is unchanged");
            LatheError::StorageRefused {
                name: name.to_string(),
                action,
                path: path.to_path_buf(),
                source,
            }
        };
        if doomed.symlink_metadata().is_ok() {
            // The leftover of an earlier delete whose removal failed: a rename onto it would fail.
            std::fs::remove_dir_all(&doomed).map_err(|source| {
                refused(
                    "removing the leftover of an earlier delete".into(),
                    &doomed,
                    source,
                )
            })?;
        }
        // No seal or merge may write into the folder once it is renamed away: that would
        // recreate `<name>/dense/` (or write into a new collection of the same name).
        let open = entry.open_collection();
        if let Some(open) = open {
            open.index.close_files();
        }
        std::fs::rename(&target, &doomed).map_err(|source| {
            if let Some(open) = open {
                open.index.reopen_files();
            }
            refused(
                format!("renaming the folder to {}", doomed.display()),
                &target,
                source,
            )
        })?;
        // From here the delete has happened: a crash leaves `.deleting-<name>`, removed at start.
        if let Err(error) = sync_dir(&self.root) {
            tracing::warn!(collection = %name, %error, "syncing the collections folder after the rename failed; removing the collection anyway");
        }
        self.write().remove(name);
        if let Some(open) = open {
            // Commits it may still hold go to a folder that is no longer there, and fail harmlessly.
            open.index.shutdown();
        }
        if let Err(error) = std::fs::remove_dir_all(&doomed) {
            tracing::warn!(collection = %name, path = %doomed.display(), %error, "removing a deleted collection's folder failed; it is removed at the next start");
        }
        Ok(())
    }

    /// The collection the alias `name` names; `None` when `name` is no alias.
    pub fn alias_target(&self, name: &str) -> Option<String> {
        self.aliases.target(name)
    }

    /// Every alias and the collection it names, by alias.
    pub fn aliases(&self) -> BTreeMap<String, String> {
        self.aliases.all()
    }

    /// Points `alias` at the collection `collection`, durably (see `aliases`), checked against
    /// the collections and the aliases.
    pub fn set_alias(&self, alias: &str, collection: &str, change: AliasChange) -> Result<()> {
        let creating = self.changing();
        if creating.contains(alias) {
            return Err(LatheError::CollectionExists {
                name: alias.to_string(),
            });
        }
        self.aliases.set(alias, collection, change, |name| {
            self.read().contains_key(name)
        })
    }

    /// Deletes `alias`; returns the collection it named.
    pub fn delete_alias(&self, alias: &str) -> Result<String> {
        let _changing = self.changing();
        self.aliases.remove(alias)
    }

    /// Sets (or, with `None`, deletes) `alias` as the write log says, unchecked: the replica that
    /// accepted the change checked it.
    pub fn apply_alias(&self, alias: &str, collection: Option<&str>) -> Result<()> {
        let _changing = self.changing();
        self.aliases.apply(alias, collection)
    }

    /// FAILED_PRECONDITION naming the aliases when any names the collection `name`.
    pub fn check_unaliased(&self, name: &str) -> Result<()> {
        let aliases = self.aliases.naming(name);
        if aliases.is_empty() {
            return Ok(());
        }
        Err(LatheError::Precondition(format!(
            "collection `{name}` is named by alias `{}`: switch or delete the alias first (a deliberate refusal: deleting it would break every reader of the alias)",
            aliases.join("`, `")
        )))
    }

    fn changing(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.changing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Commits and stops every open collection's writer (the pool's workers stop them side by
    /// side), once the closer has finished the close under way, then releases the data dir.
    pub fn shutdown(&self) {
        self.closer.stop();
        let stopping: Vec<_> = self
            .entries()
            .iter()
            .filter_map(|entry| {
                entry
                    .open_collection()
                    .map(|open| open.index.begin_shutdown())
            })
            .collect();
        for stopped in stopping {
            let _ = stopped.recv();
        }
        drop(self.lock.lock().unwrap_or_else(|p| p.into_inner()).take());
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, CollectionEntry<T>>> {
        self.residency.read()
    }

    fn write(&self) -> Listing<'_, T> {
        self.residency.write()
    }
}

impl<T> Drop for Catalog<T> {
    fn drop(&mut self) {
        // The closer holds the listing: stopped, it lets the collections go with the catalog.
        self.closer.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::fault::{MAX_CAUSE_CHARS, META_FILE};
    use super::folders::{INDEX_DIR, SETTINGS_FILE};
    use super::*;
    use crate::index::collection::{section_key, DocumentRecord, SectionRecord};

    pub(super) fn settings() -> StoredSettings {
        StoredSettings {
            budget_tokenizer: "minilm".into(),
            section_tokens: 1024,
            default_strategy: None,
            default_max_tokens: None,
            default_overlap_tokens: None,
            log_created: None,
        }
    }

    pub(super) fn record(doc_id: &str, text: &str) -> DocumentRecord {
        DocumentRecord {
            doc_id: doc_id.to_string(),
            title: doc_id.to_string(),
            metadata: Default::default(),
            text_bytes: text.len() as u64,
            version: 1,
            sections: vec![SectionRecord {
                ordinal: 0,
                heading_path: Vec::new(),
                text: text.to_string(),
                gap_after: String::new(),
                byte_start: 0,
                char_start: 0,
                section_key: section_key(doc_id, 0, 1),
                sentences: std::iter::once(0..text.len() as u32).collect(),
                sentence_vectors: Vec::new(),
                section_vector: Vec::new(),
            }],
        }
    }

    pub(super) fn open_catalog(data_dir: &Path) -> Catalog<()> {
        open_with(data_dir, |_, _| Ok(()))
    }

    fn open_with(
        data_dir: &Path,
        attach: impl Fn(&str, &StoredSettings) -> Result<(), Fault> + Send + Sync + 'static,
    ) -> Catalog<()> {
        open_budgeted(data_dir, 1_000, attach)
    }

    /// A catalog that keeps at most about `max_open` collections open.
    pub(super) fn open_budgeted(
        data_dir: &Path,
        max_open: usize,
        attach: impl Fn(&str, &StoredSettings) -> Result<(), Fault> + Send + Sync + 'static,
    ) -> Catalog<()> {
        let lock = DataDirLock::acquire(data_dir).unwrap();
        let writer_settings = WriterSettings {
            memory_bytes: 15 << 20,
            indexing_threads: 1,
            commit_interval: std::time::Duration::from_secs(3600),
            idle_close: std::time::Duration::from_secs(60),
            threads: 1,
            max_open_writers: 2,
            nice: 0,
        };
        Catalog::open(lock, data_dir, writer_settings, None, max_open, attach).unwrap()
    }

    fn fault_of(catalog: &Catalog<()>, name: &str) -> Fault {
        match catalog.entry(name).unwrap() {
            CollectionEntry::Faulted(faulted) => faulted.fault.clone(),
            CollectionEntry::Ready(_) | CollectionEntry::Closed(_) => panic!("{name} is ready"),
        }
    }

    #[test]
    fn only_the_catalogs_own_leftovers_are_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(COLLECTIONS_DIR);
        let catalog = open_catalog(dir.path());
        catalog.create("docs", settings(), ()).unwrap();
        catalog.shutdown();
        drop(catalog);
        let unfinished_create = root.join(".creating-new");
        std::fs::create_dir_all(unfinished_create.join(INDEX_DIR)).unwrap();
        std::fs::write(unfinished_create.join(SETTINGS_FILE), b"{}").unwrap();
        let unfinished_delete = root.join(".deleting-old");
        std::fs::create_dir_all(unfinished_delete.join("index")).unwrap();
        let kept = [
            root.join(".creating-mine"),
            root.join(".deleting-not a name"),
            root.join("backup.old"),
            root.join(".snapshot"),
        ];
        for folder in &kept {
            std::fs::create_dir_all(folder).unwrap();
            std::fs::write(folder.join("notes.txt"), b"an operator's").unwrap();
        }
        std::fs::write(root.join("README"), b"a file").unwrap();

        let catalog = open_catalog(dir.path());
        assert!(matches!(
            catalog.entry("docs").unwrap(),
            CollectionEntry::Ready(_)
        ));
        assert!(!unfinished_create.exists() && !unfinished_delete.exists());
        for folder in &kept {
            assert!(folder.join("notes.txt").exists(), "{}", folder.display());
        }
        assert!(root.join("README").exists());
        let names: Vec<String> = catalog
            .entries()
            .iter()
            .map(|e| e.name().to_string())
            .collect();
        assert_eq!(names, ["docs"]);
    }

    #[test]
    fn creates_run_side_by_side_and_of_one_name_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open_catalog(dir.path());
        let outcomes: Vec<Result<Arc<OpenCollection<()>>>> = std::thread::scope(|scope| {
            let creates: Vec<_> = (0..8)
                .map(|i| {
                    let catalog = &catalog;
                    // Threads 0..4 race for one name; 4..8 each create its own.
                    let name = if i < 4 {
                        "shared".to_string()
                    } else {
                        format!("own-{i}")
                    };
                    scope.spawn(move || catalog.create(&name, settings(), ()))
                })
                .collect();
            creates.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let (shared, own) = outcomes.split_at(4);
        assert_eq!(shared.iter().filter(|r| r.is_ok()).count(), 1);
        for lost in shared.iter().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(lost, LatheError::CollectionExists { name } if name == "shared"),
                "{lost:?}"
            );
        }
        assert!(own.iter().all(Result::is_ok));
        let names: Vec<String> = catalog
            .entries()
            .iter()
            .map(|e| e.name().to_string())
            .collect();
        assert_eq!(names, ["own-4", "own-5", "own-6", "own-7", "shared"]);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join(COLLECTIONS_DIR))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_name_being_created_is_taken_for_creates_and_aliases_until_it_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open_catalog(dir.path());
        catalog.create("target", settings(), ()).unwrap();
        let reserved = catalog.reserve("busy").unwrap();
        assert!(matches!(
            catalog.create("busy", settings(), ()),
            Err(LatheError::CollectionExists { .. })
        ));
        assert!(matches!(
            catalog.set_alias("busy", "target", AliasChange::Create),
            Err(LatheError::CollectionExists { .. })
        ));
        assert!(matches!(
            catalog.delete("busy"),
            Err(LatheError::CollectionNotFound { .. })
        ));
        drop(reserved);
        catalog.create("busy", settings(), ()).unwrap();
        assert!(catalog.changing().is_empty());
    }

    #[test]
    fn a_collection_that_cannot_open_is_kept_listed_and_deletable() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(COLLECTIONS_DIR);
        let catalog = open_catalog(dir.path());
        for name in ["no-settings", "no-meta", "offline", "fine"] {
            catalog.create(name, settings(), ()).unwrap();
        }
        catalog.shutdown();
        drop(catalog);
        std::fs::remove_file(root.join("no-settings").join(SETTINGS_FILE)).unwrap();
        std::fs::remove_file(root.join("no-meta/index").join(META_FILE)).unwrap();
        let files_of = |name: &str| {
            let mut files: Vec<_> = std::fs::read_dir(root.join(name).join(INDEX_DIR))
                .map(|listing| listing.map(|item| item.unwrap().file_name()).collect())
                .unwrap_or_default();
            files.sort();
            files
        };
        let no_meta_files = files_of("no-meta");

        let catalog = open_with(dir.path(), |name, _| {
            if name == "offline" {
                Err(Fault::offline("/models/gone.json", "missing"))
            } else {
                Ok(())
            }
        });
        let fault = fault_of(&catalog, "no-settings");
        assert_eq!(fault.kind, FaultKind::Damaged);
        assert_eq!(fault.path, root.join("no-settings").join(SETTINGS_FILE));
        assert!(matches!(
            catalog.get("no-settings"),
            Err(LatheError::CollectionDamaged { .. })
        ));
        // An empty index was not created in place of the missing metadata.
        assert_eq!(
            fault_of(&catalog, "no-meta").path,
            root.join("no-meta/index").join(META_FILE)
        );
        assert_eq!(files_of("no-meta"), no_meta_files);
        assert!(matches!(
            catalog.get("offline"),
            Err(LatheError::CollectionOffline { .. })
        ));
        assert!(catalog.get("fine").is_ok());

        for name in ["no-settings", "no-meta", "offline"] {
            catalog.delete(name).unwrap();
            assert!(!root.join(name).exists());
            catalog.create(name, settings(), ()).unwrap();
            assert!(catalog.get(name).is_ok());
        }
        catalog.shutdown();
    }

    #[test]
    fn a_corrupt_meta_file_is_named_with_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open_catalog(dir.path());
        catalog.create("empty", settings(), ()).unwrap();
        catalog.create("garbage", settings(), ()).unwrap();
        catalog.shutdown();
        drop(catalog);
        let meta = |name: &str| {
            dir.path()
                .join(COLLECTIONS_DIR)
                .join(name)
                .join(INDEX_DIR)
                .join(META_FILE)
        };
        std::fs::write(meta("empty"), b"").unwrap();
        std::fs::write(meta("garbage"), "x".repeat(10_000)).unwrap();
        let catalog = open_catalog(dir.path());
        assert_eq!(
            fault_of(&catalog, "empty"),
            Fault::damaged(meta("empty"), "the file is empty")
        );
        let garbage = fault_of(&catalog, "garbage");
        assert!(garbage.cause.starts_with("not valid JSON"), "{garbage}");
        assert!(garbage.cause.chars().count() <= MAX_CAUSE_CHARS + 1);
    }

    #[test]
    fn a_folder_put_in_place_by_hand_is_never_built_over() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open_catalog(dir.path());
        let by_hand = dir.path().join(COLLECTIONS_DIR).join("late");
        std::fs::create_dir_all(&by_hand).unwrap();
        std::fs::write(by_hand.join("notes.txt"), b"mine").unwrap();
        let error = catalog
            .create("late", settings(), ())
            .err()
            .expect("refused");
        assert!(
            matches!(error, LatheError::StorageRefused { ref path, .. } if *path == by_hand),
            "{error}"
        );
        assert!(by_hand.join("notes.txt").exists());
        assert!(!dir
            .path()
            .join(COLLECTIONS_DIR)
            .join(".creating-late")
            .exists());
    }

    #[test]
    fn aliases_share_the_collections_namespace_and_hold_their_collection() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open_catalog(dir.path());
        catalog.create("v1", settings(), ()).unwrap();
        catalog.create("v2", settings(), ()).unwrap();
        catalog
            .set_alias("live", "v1", AliasChange::Create)
            .unwrap();
        assert!(matches!(
            catalog.create("live", settings(), ()),
            Err(LatheError::AliasExists { ref collection, .. }) if collection == "v1"
        ));
        let refused = catalog.delete("v1").unwrap_err().to_string();
        assert!(refused.contains("named by alias `live`"), "{refused}");
        assert!(catalog.get("v1").is_ok());
        catalog
            .set_alias("live", "v2", AliasChange::Switch)
            .unwrap();
        catalog.delete("v1").unwrap();
        // A delete the log holds goes ahead; the alias stays, naming what is gone.
        catalog.delete_even_if_aliased("v2").unwrap();
        assert_eq!(catalog.alias_target("live").as_deref(), Some("v2"));
        catalog.shutdown();
        drop(catalog);
        let reopened = open_catalog(dir.path());
        assert_eq!(reopened.alias_target("live").as_deref(), Some("v2"));
        assert!(reopened.entries().is_empty());
    }

    #[test]
    fn the_data_dir_lock_is_released_at_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = open_catalog(dir.path());
        assert!(matches!(
            DataDirLock::acquire(dir.path()),
            Err(LatheError::DataDirLocked { .. })
        ));
        catalog.shutdown();
        // The catalog is still alive, but the next server may start.
        DataDirLock::acquire(dir.path()).unwrap();
    }
}
