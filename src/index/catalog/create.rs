//! Creating a collection: its name reserved under the catalog's `changing` lock (the set of
//! names being created or restored), then, outside it, a staging folder built with the settings
//! and an empty index, renamed into place, synced and opened, and the collection listed before
//! the reservation ends. Creates of different names run side by side.

use std::path::Path;
use std::sync::Arc;

use super::folders::{sync_dir, write_settings, CREATING_PREFIX, INDEX_DIR, SETTINGS_FILE};
use super::{is_valid_collection_name, Catalog, CollectionEntry, OpenCollection, StoredSettings};
use crate::error::{LatheError, Result};
use crate::index::collection::CollectionIndex;

impl<T> Catalog<T> {
    /// Creates a collection atomically: it is built in a hidden folder and renamed into place.
    /// A failure leaves neither a listed collection nor a folder that would appear at restart.
    pub fn create(
        &self,
        name: &str,
        settings: StoredSettings,
        extra: T,
    ) -> Result<Arc<OpenCollection<T>>> {
        debug_assert!(is_valid_collection_name(name));
        let reserved = self.reserve(name)?;
        let staging = self.root.join(format!("{CREATING_PREFIX}{name}"));
        let built = self.build_staging(name, &staging, &settings);
        if let Err(error) = built {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(error);
        }
        self.publish(&reserved, &staging, settings, extra)
    }

    /// Reserves `name` for a collection about to be created or restored, once no collection,
    /// alias, folder or other create holds it; the name is free again when the reservation is
    /// dropped (by then the collection is listed, or the attempt failed).
    pub(super) fn reserve(&self, name: &str) -> Result<Reserved<'_, T>> {
        let mut creating = self.changing();
        if creating.contains(name) {
            return Err(LatheError::CollectionExists {
                name: name.to_string(),
            });
        }
        self.check_name_free(name)?;
        creating.insert(name.to_string());
        Ok(Reserved {
            catalog: self,
            name: name.to_string(),
        })
    }

    /// That no collection, alias or folder holds `name` (final only under the `changing` lock,
    /// as [`Catalog::reserve`] calls it).
    pub(super) fn check_name_free(&self, name: &str) -> Result<()> {
        if self.read().contains_key(name) {
            return Err(LatheError::CollectionExists {
                name: name.to_string(),
            });
        }
        if let Some(collection) = self.aliases.target(name) {
            return Err(LatheError::AliasExists {
                alias: name.to_string(),
                collection,
            });
        }
        let target = self.root.join(name);
        if target.symlink_metadata().is_ok() {
            // Put there by hand after this server started: never build over it.
            return Err(LatheError::StorageRefused {
                name: name.to_string(),
                action: "creating the collection folder".into(),
                path: target,
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "a folder of that name appeared after the server started; move it away or restart the server to open it",
                ),
            });
        }
        Ok(())
    }

    /// Renames a complete collection folder (`staging`) into place, durably, opens it and lists
    /// it (its name reserved): the rename is the moment the collection appears. A failure leaves
    /// neither a listed collection nor a folder that would appear at restart.
    pub(super) fn publish(
        &self,
        reserved: &Reserved<'_, T>,
        staging: &Path,
        settings: StoredSettings,
        extra: T,
    ) -> Result<Arc<OpenCollection<T>>> {
        let name = reserved.name.as_str();
        if let Err(error) = self.check_room() {
            let _ = std::fs::remove_dir_all(staging);
            return Err(error);
        }
        let target = self.root.join(name);
        if let Err(source) = std::fs::rename(staging, &target) {
            let _ = std::fs::remove_dir_all(staging);
            return Err(LatheError::StorageRefused {
                name: name.to_string(),
                action: format!("renaming {} into place", staging.display()),
                path: target,
                source,
            });
        }
        if let Err(error) = sync_dir(&self.root) {
            self.unpublish_or_log(name, &target, staging);
            return Err(error);
        }
        let index = match CollectionIndex::open(
            &target.join(INDEX_DIR),
            name,
            self.dense.clone(),
            &self.writer_settings,
            &self.writer_pool,
        ) {
            Ok(index) => index,
            Err(error) => {
                // Unpublish, so that the failed create does not appear at the next start.
                self.unpublish_or_log(name, &target, staging);
                return Err(error);
            }
        };
        let collection = Arc::new(OpenCollection::new(name, settings, index, extra));
        collection.touch(self.residency.now_ms());
        self.write().insert(
            name.to_string(),
            CollectionEntry::Ready(Arc::clone(&collection)),
        );
        self.after_open();
        Ok(collection)
    }

    /// Writes the settings and an empty index into the staging folder (the dense index's folder
    /// is made at the first open).
    fn build_staging(&self, name: &str, staging: &Path, settings: &StoredSettings) -> Result<()> {
        // A leftover of an earlier failed create of this name: ours to clear.
        let _ = std::fs::remove_dir_all(staging);
        std::fs::create_dir_all(staging).map_err(|source| LatheError::StorageRefused {
            name: name.to_string(),
            action: "creating the staging folder".into(),
            path: staging.to_path_buf(),
            source,
        })?;
        write_settings(staging, settings).map_err(|source| LatheError::StorageRefused {
            name: name.to_string(),
            action: "writing the settings".into(),
            path: staging.join(SETTINGS_FILE),
            source,
        })?;
        // Create the empty index on disk before the rename; it is opened in place afterwards.
        CollectionIndex::create_empty(&staging.join(INDEX_DIR), name)
    }

    fn unpublish_or_log(&self, name: &str, target: &Path, staging: &Path) {
        let unpublished = std::fs::rename(target, staging)
            .and_then(|()| std::fs::File::open(&self.root).and_then(|dir| dir.sync_all()));
        match unpublished {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(staging);
            }
            Err(error) => {
                tracing::error!(collection = %name, path = %target.display(), %error, "a failed create could not be undone; the empty collection will be opened at the next start");
            }
        }
    }
}

/// A name reserved by [`Catalog::reserve`] while its collection is built, published and opened.
pub(super) struct Reserved<'a, T> {
    catalog: &'a Catalog<T>,
    name: String,
}

impl<T> Drop for Reserved<'_, T> {
    fn drop(&mut self) {
        self.catalog.changing().remove(&self.name);
    }
}
