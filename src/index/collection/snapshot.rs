//! The [`Snapshot`] a query holds for all its stages: a searcher, the generation it shows, and
//! the raw stored bytes of a section at a position (with the section key the position holds),
//! which `reader` decodes and verifies. Also [`FoundSection`], where a search found a section.

use std::sync::OnceLock;

use tantivy::columnar::Column;
use tantivy::directory::OwnedBytes;
use tantivy::store::StoreReader;
use tantivy::{DocAddress, Searcher};

/// A consistent view of the index: the searcher and the generation it shows. Queries take one
/// snapshot and use it for every stage and for their cache key.
pub struct Snapshot {
    pub searcher: Searcher,
    pub generation: u64,
    /// The doc store of each of the searcher's segments, opened at the first stored read.
    stores: OnceLock<Vec<SegmentStore>>,
}

/// What reading one segment's stored sections needs.
struct SegmentStore {
    store: std::result::Result<StoreReader, String>,
    /// The `section_key` fast field: which section each position holds, from a file other than
    /// the doc store, so that stored bytes can be tied to the position they were read for.
    section_keys: Option<Column<u64>>,
}

/// Decompressed doc-store blocks (16 KiB each) cached per segment. The searcher's store readers
/// are built without a cache, since stored sections are read only through these. A query reads
/// its hits in store order ([`CollectionIndex::read_found`]), so it decompresses each block
/// once whatever this keeps; what it keeps serves the next queries. tantivy's default of 100
/// held 23 MB at a million sections (14 segments), for blocks that another query seldom reads,
/// and grows with every segment of every collection (docs/notebook/benchmarks-notebook.md, "Smaller caches").
///
/// [`CollectionIndex::read_found`]: crate::index::CollectionIndex::read_found
const STORE_CACHE_BLOCKS: usize = 8;

impl Snapshot {
    pub fn new(searcher: Searcher, generation: u64) -> Self {
        Self {
            searcher,
            generation,
            stores: OnceLock::new(),
        }
    }

    /// The bytes tantivy's doc store holds for the document at `address`, undecoded, and the
    /// section key the position holds; on failure, why (for a data-loss message).
    pub(super) fn stored_bytes(
        &self,
        address: DocAddress,
    ) -> std::result::Result<(OwnedBytes, Option<u64>), String> {
        let stores = self.segment_stores();
        let segment = stores
            .get(address.segment_ord as usize)
            .ok_or_else(|| format!("segment {} is not in the snapshot", address.segment_ord))?;
        let store = segment.store.as_ref().map_err(Clone::clone)?;
        let bytes = catch_panic(|| store.get_document_bytes(address.doc_id))?
            .map_err(|error| format!("its stored bytes cannot be read ({error})"))?;
        let section_key = segment
            .section_keys
            .as_ref()
            .and_then(|column| column.first(address.doc_id));
        Ok((bytes, section_key))
    }

    /// What reading each segment's stored sections needs, opened at the first use.
    fn segment_stores(&self) -> &[SegmentStore] {
        self.stores.get_or_init(|| {
            self.searcher
                .segment_readers()
                .iter()
                .map(|segment| SegmentStore {
                    // Store files are verified before they are opened, but one changed in place
                    // afterwards (it is memory-mapped) can make tantivy's footer and block
                    // parsing panic (it asserts on what it reads): keep that to this read.
                    store: catch_panic(|| segment.get_store_reader(STORE_CACHE_BLOCKS)).and_then(
                        |opened| {
                            opened.map_err(|error| {
                                format!("its doc store cannot be opened ({error})")
                            })
                        },
                    ),
                    section_keys: segment.fast_fields().u64("section_key").ok(),
                })
                .collect()
        })
    }

    /// The key of the section at `address`, from the `section_key` fast field (no stored read).
    pub(super) fn section_key_at(&self, address: DocAddress) -> Option<u64> {
        self.segment_stores()
            .get(address.segment_ord as usize)?
            .section_keys
            .as_ref()?
            .first(address.doc_id)
    }
}

/// A section a search found, not read yet: where it lies, its key and its score in that search.
/// Searches return these so that a caller that keeps only some (the coarse stage's fusion) reads
/// only those, each once ([`CollectionIndex::read_found`]).
///
/// [`CollectionIndex::read_found`]: crate::index::CollectionIndex::read_found
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FoundSection {
    pub(super) address: DocAddress,
    pub section_key: u64,
    pub score: f32,
}

/// Runs `read` (tantivy decoding doc-store bytes), turning a panic into an error message (the
/// caller's, naming the file; the panic hook stays quiet).
fn catch_panic<T>(read: impl FnOnce() -> T) -> std::result::Result<T, String> {
    crate::panic_log::catch(read)
        .map_err(|panic| format!("its doc-store block is damaged (decoding it panicked: {panic})"))
}

/// The document id of the section at `address`, from the `doc_id` fast field: readable when the
/// section's stored bytes are not.
pub(super) fn stored_document_id(searcher: &Searcher, address: DocAddress) -> Option<String> {
    let segment = searcher.segment_reader(address.segment_ord);
    let column = segment.fast_fields().str("doc_id").ok()??;
    let ordinal = column.term_ords(address.doc_id).next()?;
    let mut document = String::new();
    column
        .ord_to_str(ordinal, &mut document)
        .ok()?
        .then_some(document)
}
