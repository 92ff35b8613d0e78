//! What the catalog holds for one collection name: a [`CollectionEntry`], either the
//! [`OpenCollection`] that serves or the [`FaultedCollection`] kept listed beside the ready ones,
//! with the [`Fault`] that keeps it from serving.

use std::sync::Arc;

use super::fault::Fault;
use super::settings::StoredSettings;
use crate::index::collection::CollectionIndex;

/// An open collection: its settings and its index.
pub struct OpenCollection<T> {
    pub name: String,
    pub settings: StoredSettings,
    pub index: CollectionIndex,
    /// What the service attaches (tokenizer, ...).
    pub extra: T,
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
    Faulted(Arc<FaultedCollection>),
}

impl<T> Clone for CollectionEntry<T> {
    fn clone(&self) -> Self {
        match self {
            Self::Ready(open) => Self::Ready(Arc::clone(open)),
            Self::Faulted(faulted) => Self::Faulted(Arc::clone(faulted)),
        }
    }
}

impl<T> CollectionEntry<T> {
    pub fn name(&self) -> &str {
        match self {
            Self::Ready(open) => &open.name,
            Self::Faulted(faulted) => &faulted.name,
        }
    }

    /// The open collection, if any.
    pub(super) fn open_collection(&self) -> Option<&Arc<OpenCollection<T>>> {
        match self {
            Self::Ready(open) => Some(open),
            Self::Faulted(_) => None,
        }
    }
}
