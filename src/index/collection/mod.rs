//! One collection: its tantivy index of sections, the snapshot its readers hold, its writer and
//! the shared pool that runs it, and the dense index kept in step. Knows nothing of the catalog.
//!
//! Files import one way, bottom up: `records`, `stems` → `schema` → `section_document`;
//! `store_reads` → `storage` → `integrity`; `snapshot` (the [`Snapshot`]) → `top_k` (BM25's
//! top-k across segments); `snapshot` → `dense_upkeep`, `first_segment` → `writer` (over `writer_pool`) →
//! `handle` (the [`CollectionIndex`] and its open) → `reader` and `inspect` (more methods of
//! [`CollectionIndex`]). Nothing imports what imports it.

mod backup;
mod dense_upkeep;
mod first_segment;
mod handle;
mod inspect;
pub mod integrity;
mod managed_list;
mod reader;
mod records;
pub mod schema;
mod scrub;
mod section_document;
mod snapshot;
mod stems;
pub mod storage;
mod store_reads;
#[cfg(test)]
mod testing;
mod top_k;
mod writer;
pub mod writer_pool;

pub use backup::{BackupFile, BackupFiles, BackupSource, BACKUP_DENSE_DIR, BACKUP_INDEX_DIR};
pub use handle::{dense_dir, CollectionIndex};
pub use inspect::{StoredDocument, StoredDocumentSection};
pub use records::{
    gap_after, section_key, DocumentRecord, SectionHit, SectionRecord, StoredEmbedding, WriteOp,
    MAX_GAP_BYTES,
};
pub use snapshot::{FoundSection, Snapshot};
pub use writer::{CollectionWriterPool, WriterSettings};
