//! Opening one collection found at start (the catalog opens several at once): its settings, its
//! index metadata checked before tantivy could make an empty index in its place, the service's
//! part, then the index; whatever fails makes it a faulted entry, kept as found.

use std::path::Path;
use std::sync::Arc;

use super::entry::{CollectionEntry, FaultedCollection, OpenCollection};
use super::fault::{check_index_meta, diagnose_index, Fault};
use super::folders::{read_settings, INDEX_DIR};
use super::settings::StoredSettings;
use crate::dense::DenseIndexConfig;
use crate::error::{LatheError, Result};
use crate::index::collection::{CollectionIndex, CollectionWriterPool, WriterSettings};

/// What opening one collection needs, shared by the threads that open them at start.
pub(super) struct Opener<'a> {
    pub(super) root: &'a Path,
    pub(super) writer_settings: &'a WriterSettings,
    pub(super) writer_pool: &'a CollectionWriterPool,
    pub(super) dense: Option<DenseIndexConfig>,
}

impl Opener<'_> {
    /// Opens the collection in `root/name`, or says why it cannot serve.
    pub(super) fn open_collection<T>(
        &self,
        name: &str,
        attach: &impl Fn(&str, &StoredSettings) -> Result<T, Fault>,
    ) -> CollectionEntry<T> {
        let folder = self.root.join(name);
        let faulted = |fault: Fault, settings: Option<StoredSettings>| {
            tracing::error!(collection = %name, file = %fault.path.display(), cause = %fault.cause, kind = ?fault.kind, "collection cannot be opened; it is kept as found and the other collections serve");
            CollectionEntry::Faulted(Arc::new(FaultedCollection {
                name: name.to_string(),
                fault,
                settings,
            }))
        };
        let settings = match read_settings(&folder) {
            Ok(settings) => settings,
            Err(fault) => return faulted(fault, None),
        };
        let index_dir = folder.join(INDEX_DIR);
        // `CollectionIndex::open` would make an empty index where the metadata is missing, and tantivy's
        // next commit would then collect the old segment files as garbage.
        if let Err(fault) = check_index_meta(&index_dir) {
            return faulted(fault, Some(settings));
        }
        // Before the index: a collection that cannot serve never starts a writer on its files.
        let extra = match attach(name, &settings) {
            Ok(extra) => extra,
            Err(fault) => return faulted(fault, Some(settings)),
        };
        let index = match CollectionIndex::open(
            &index_dir,
            name,
            self.dense.clone(),
            self.writer_settings,
            self.writer_pool,
        ) {
            Ok(index) => index,
            // Written by another version of Lathe: intact, but not readable by this one.
            Err(LatheError::IncompatibleIndex { reason, .. }) => {
                return faulted(Fault::offline(&index_dir, reason), Some(settings))
            }
            Err(error) => return faulted(diagnose_index(&index_dir, &error), Some(settings)),
        };
        tracing::info!(collection = %name, generation = index.snapshot().generation, "opened collection");
        CollectionEntry::Ready(Arc::new(OpenCollection {
            name: name.to_string(),
            settings,
            index,
            extra,
        }))
    }
}
