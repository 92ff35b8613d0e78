//! Opening one collection: its settings (at start, for every collection), then, when it opens
//! (at start for the first `storage.max_open_collections`, later on first use), its index
//! metadata checked before tantivy could make an empty index in its place, the service's part,
//! then the index; whatever fails makes it a faulted entry, kept as found.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::entry::{ClosedCollection, CollectionEntry, FaultedCollection, OpenCollection};
use super::fault::{check_index_meta, diagnose_index, Fault};
use super::folders::{read_settings, INDEX_DIR};
use super::parallel::map_in_parallel;
use super::settings::StoredSettings;
use crate::dense::DenseIndexConfig;
use crate::error::LatheError;
use crate::index::collection::{CollectionIndex, CollectionWriterPool, WriterSettings};

/// Builds the service's part of a collection, or says why it cannot serve.
pub(super) type Attach<T> = dyn Fn(&str, &StoredSettings) -> Result<T, Fault> + Send + Sync;

/// What opening a collection needs, shared by the threads that open them.
pub(super) struct Opener<'a> {
    pub(super) root: &'a Path,
    pub(super) writer_settings: &'a WriterSettings,
    pub(super) writer_pool: &'a CollectionWriterPool,
    pub(super) dense: Option<DenseIndexConfig>,
}

/// A faulted entry for `name`, logged once.
fn faulted<T>(name: &str, fault: Fault, settings: Option<StoredSettings>) -> CollectionEntry<T> {
    tracing::error!(collection = %name, file = %fault.path.display(), cause = %fault.cause, kind = ?fault.kind, "collection cannot be opened; it is kept as found and the other collections serve");
    CollectionEntry::Faulted(Arc::new(FaultedCollection {
        name: name.to_string(),
        fault,
        settings,
    }))
}

/// Collections opened at once at start: opening reads every index's metadata and verifies its
/// files, mostly waiting on the disk for many small collections, so a few at a time, whatever
/// the core count.
const OPEN_THREADS: usize = 8;

/// Settings of closed collections read at once at start (each waits on the disk, cold).
const READ_THREADS: usize = 32;

impl Opener<'_> {
    /// The collections `names` (sorted) at start: the first `max_open` opened, the rest closed.
    pub(super) fn open_at_start<T: Send + Sync>(
        &self,
        mut names: Vec<String>,
        max_open: usize,
        attach: &Attach<T>,
    ) -> BTreeMap<String, CollectionEntry<T>> {
        let closed = names.split_off(max_open.min(names.len()));
        let mut entries: BTreeMap<_, _> = map_in_parallel(names, OPEN_THREADS, |name| {
            let entry = self.open_collection(&name, attach);
            (name, entry)
        })
        .into_iter()
        .collect();
        entries.extend(map_in_parallel(closed, READ_THREADS, |name| {
            let entry = self.closed(&name);
            (name, entry)
        }));
        entries
    }

    /// The collection in `root/name` closed: its settings read, nothing else (a faulted entry
    /// when they cannot be read).
    pub(super) fn closed<T>(&self, name: &str) -> CollectionEntry<T> {
        match read_settings(&self.root.join(name)) {
            Ok(settings) => {
                CollectionEntry::Closed(Arc::new(ClosedCollection::new(name, settings)))
            }
            Err(fault) => faulted(name, fault, None),
        }
    }

    /// Opens the collection in `root/name`, or says why it cannot serve.
    pub(super) fn open_collection<T>(&self, name: &str, attach: &Attach<T>) -> CollectionEntry<T> {
        match read_settings(&self.root.join(name)) {
            Ok(settings) => self.open_with(name, settings, attach),
            Err(fault) => faulted(name, fault, None),
        }
    }

    /// Opens the index of the collection in `root/name` whose settings are read.
    pub(super) fn open_with<T>(
        &self,
        name: &str,
        settings: StoredSettings,
        attach: &Attach<T>,
    ) -> CollectionEntry<T> {
        let index_dir = self.root.join(name).join(INDEX_DIR);
        // `CollectionIndex::open` would make an empty index where the metadata is missing, and tantivy's
        // next commit would then collect the old segment files as garbage.
        if let Err(fault) = check_index_meta(&index_dir) {
            return faulted(name, fault, Some(settings));
        }
        // Before the index: a collection that cannot serve never starts a writer on its files.
        let extra = match attach(name, &settings) {
            Ok(extra) => extra,
            Err(fault) => return faulted(name, fault, Some(settings)),
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
                return faulted(name, Fault::offline(&index_dir, reason), Some(settings))
            }
            Err(error) => return faulted(name, diagnose_index(&index_dir, &error), Some(settings)),
        };
        tracing::info!(collection = %name, generation = index.snapshot().generation, "opened collection");
        CollectionEntry::Ready(Arc::new(OpenCollection::new(name, settings, index, extra)))
    }
}
