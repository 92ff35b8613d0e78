//! What the catalog holds for one collection name: a [`CollectionEntry`], either the
//! [`OpenCollection`] that serves, the [`ClosedCollection`] that opens on first use (see
//! `residency`), or the [`FaultedCollection`] kept listed beside the ready ones, with the
//! [`Fault`] that keeps it from serving.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::fault::Fault;
use super::settings::StoredSettings;
use crate::index::collection::CollectionIndex;
use crate::types::CollectionStats;

/// An open collection: its settings and its index.
pub struct OpenCollection<T> {
    pub name: String,
    pub settings: StoredSettings,
    pub index: CollectionIndex,
    /// What the service attaches (tokenizer, ...).
    pub extra: T,
    /// When it was last handed out, in milliseconds of the catalog's clock: the least recently
    /// used idle collections are the ones closed past `storage.max_open_collections`.
    pub(super) last_used: AtomicU64,
}

impl<T> OpenCollection<T> {
    pub(super) fn new(
        name: &str,
        settings: StoredSettings,
        index: CollectionIndex,
        extra: T,
    ) -> Self {
        Self {
            name: name.to_string(),
            settings,
            index,
            extra,
            last_used: AtomicU64::new(0),
        }
    }

    pub(super) fn touch(&self, now_ms: u64) {
        self.last_used.store(now_ms, Ordering::Relaxed);
    }
}

/// A collection whose folder is there and whose settings were read, but whose index is not
/// open: not used since the server started, or closed to make room for others. It opens on
/// first use; a fault found then makes it faulted.
pub struct ClosedCollection {
    pub name: String,
    pub settings: StoredSettings,
    /// Its statistics when it closed; unset when it has not been open since the server started.
    stats: OnceLock<CollectionStats>,
    /// Held while its index closes, and by whoever opens it: one open at a time, and never
    /// beside the index that is closing (whose writer may still commit).
    pub(super) gate: Mutex<()>,
}

impl ClosedCollection {
    pub(super) fn new(name: &str, settings: StoredSettings) -> Self {
        Self {
            name: name.to_string(),
            settings,
            stats: OnceLock::new(),
            gate: Mutex::new(()),
        }
    }

    /// Its statistics when it closed, if it was open since the server started.
    pub fn stats(&self) -> Option<CollectionStats> {
        self.stats.get().copied()
    }

    pub(super) fn set_stats(&self, stats: CollectionStats) {
        let _ = self.stats.set(stats);
    }
}

/// A collection that cannot serve; its folder is kept as it was found.
pub struct FaultedCollection {
    pub name: String,
    pub fault: Fault,
    /// Its settings, when `collection.json` could be read.
    pub settings: Option<StoredSettings>,
}

/// What the catalog holds for one collection name.
pub enum CollectionEntry<T> {
    Ready(Arc<OpenCollection<T>>),
    Closed(Arc<ClosedCollection>),
    Faulted(Arc<FaultedCollection>),
}

impl<T> Clone for CollectionEntry<T> {
    fn clone(&self) -> Self {
        match self {
            Self::Ready(open) => Self::Ready(Arc::clone(open)),
            Self::Closed(closed) => Self::Closed(Arc::clone(closed)),
            Self::Faulted(faulted) => Self::Faulted(Arc::clone(faulted)),
        }
    }
}

impl<T> CollectionEntry<T> {
    pub fn name(&self) -> &str {
        match self {
            Self::Ready(open) => &open.name,
            Self::Closed(closed) => &closed.name,
            Self::Faulted(faulted) => &faulted.name,
        }
    }

    /// Its settings, unless `collection.json` could not be read.
    pub fn settings(&self) -> Option<&StoredSettings> {
        match self {
            Self::Ready(open) => Some(&open.settings),
            Self::Closed(closed) => Some(&closed.settings),
            Self::Faulted(faulted) => faulted.settings.as_ref(),
        }
    }

    /// The open collection, if any.
    pub(super) fn open_collection(&self) -> Option<&Arc<OpenCollection<T>>> {
        match self {
            Self::Ready(open) => Some(open),
            Self::Closed(_) | Self::Faulted(_) => None,
        }
    }

    pub(super) fn is_open(&self) -> bool {
        matches!(self, Self::Ready(_))
    }
}
