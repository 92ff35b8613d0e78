//! The coarse index: collections on disk, each a tantivy index of sections (see `collection`),
//! and the catalog that creates, opens, lists and deletes them (see `catalog`). Knows nothing of
//! the pipeline or of gRPC.
//!
//! # Layout
//! Two rooms, and the catalog stands on the collection: `catalog` imports from `collection`,
//! never the other way, and within each room the files import one way too.
//! - `catalog`: the [`Catalog`] (its `mod.rs`: create, open, list, delete, shut down); `folders`:
//!   the collections folder's layout, leftovers and settings file; `entry`: what it holds per name
//!   ([`CollectionEntry`]: an [`OpenCollection`], a [`ClosedCollection`] or a
//!   [`FaultedCollection`]); `residency`: which are open (opened on first use, the least recently
//!   used idle ones closed past `storage.max_open_collections`); `settings`: the
//!   collection name rule and [`StoredSettings`]; `fault`: why a collection cannot serve
//!   ([`Fault`]) and how that is found; `aliases`: second names of collections and
//!   `aliases.json`; `lock`: the data dir lock; `parallel`: opening
//!   collections a few at a time.
//! - `collection`: one collection. `handle` (the [`CollectionIndex`] handle: open, write, shut
//!   down), `records` (what is written and what a search returns), `schema` (tantivy fields and
//!   the analyzer) with `section_document` beside it (a section written as a tantivy document and
//!   read back, verified), `snapshot` (the [`Snapshot`] and its stored reads), `reader`
//!   (searches, section loads, stats), `inspect` (read-only views for tools), `writer` (the
//!   writer the pool runs: apply, group commit, abandon), `dense_upkeep` (the dense index kept in
//!   step); shared by all collections: `writer_pool` (the writer threads), `storage` (the
//!   directory and its storage errors), `integrity` (every file verified before tantivy reads
//!   it).
//!
//! Everything callers use is re-exported here.
//!
//! # The data dir
//! `data_dir/lathe.lock` keeps a second server out (see `lock`); each collection lives in
//! `data_dir/collections/<name>/{collection.json, index/}`; the aliases in `data_dir/aliases.json`
//! (see `aliases`: replaced by a rename, as a collection folder is). Besides those folders the catalog makes
//! only two kinds of hidden folder, and they are the only folders it ever removes on its own:
//! `.creating-<name>` (a collection being built, renamed into place when complete) and
//! `.deleting-<name>` (a collection renamed away by a delete, then removed). A crash leaves a
//! collection wholly there or wholly gone: the rename is the moment it appears or disappears.
//!
//! # Collection states
//! A collection that cannot be opened (its `collection.json` or index files missing, truncated or
//! garbled, its tokenizer file gone) is kept exactly as found and listed as [`Faulted`] with the
//! file and the cause; every other collection opens and serves. Calls to a faulted collection get
//! [`Fault::error`]; deleting it works. Damage found while a collection is open (a section or a
//! new segment file failing its checksum, see `integrity`) leaves it ready: every read is
//! verified, what fails answers DATA_LOSS and the rest is served; the service lists it damaged
//! with [`CollectionIndex::damage`] as the reason.
//!
//! [`Faulted`]: CollectionEntry::Faulted

mod catalog;
pub mod collection;

pub use crate::dense::{
    DenseIndexConfig, SEARCH_WAIT_MAX_SECONDS as DENSE_SEARCH_WAIT_MAX_SECONDS,
    SEARCH_WAIT_SECONDS as DENSE_SEARCH_WAIT_SECONDS, TIER_MERGE_FACTOR as DENSE_TIER_MERGE_FACTOR,
};
pub use catalog::{
    extract_snapshot, is_valid_collection_name, lock, AliasChange, Catalog, ClosedCollection,
    CollectionEntry, DataDirLock, Fault, FaultKind, FaultedCollection, OpenCollection,
    SnapshotInfo, SnapshotManifest, StoredSettings, TakenSnapshot,
};
pub use collection::{
    dense_dir, gap_after, integrity, schema, section_key, storage, writer_pool, CollectionIndex,
    CollectionWriterPool, DocumentRecord, FoundSection, SectionHit, SectionRecord, Snapshot,
    StoredDocument, StoredDocumentSection, StoredEmbedding, WriteOp, WriterSettings, MAX_GAP_BYTES,
};
