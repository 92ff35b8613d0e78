//! The `storage` and `dense` sections: where collections live on disk, their writers, and each
//! collection's dense index.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// One folder per collection lives under it.
    pub data_dir: PathBuf,
    /// Writes without `wait` are committed (made durable and visible) within this interval.
    pub commit_interval_ms: u64,
    /// Indexing arena of each open tantivy writer, in bytes (shared by its indexing threads).
    pub writer_memory_bytes: usize,
    /// Indexing threads of each open tantivy writer: a large write is indexed on this many
    /// threads side by side, each with `writer_memory_bytes / indexing_threads` of arena (fewer
    /// threads when that would be under tantivy's 15 MB minimum).
    pub indexing_threads: usize,
    /// Threads that apply writes and commit, shared by every collection. A commit mostly waits
    /// on the disk (a small one syncs about twenty files), so there are more than cores: with
    /// 2, eight clients each creating and writing small collections waited on two commits at
    /// a time (issue 52, 115 collections a second against 150–170 with 4).
    pub writer_threads: usize,
    /// Tantivy writers open at once (each holds `indexing_threads` + 2 threads, a file lock and
    /// up to `writer_memory_bytes`); past it, the least recently used idle writer is committed
    /// and closed to make room.
    pub max_open_writers: usize,
    /// A collection's writer is closed after this long without writes (milliseconds).
    pub writer_idle_ms: u64,
    /// Collections open at once. An open collection holds its index's memory maps (about 7
    /// per segment, against the kernel's `vm.max_map_count`) and its dense index in memory; a
    /// closed one only its name and settings. At start the first this many (by name) open, the
    /// rest when first used; past it the least recently used idle ones close.
    pub max_open_collections: usize,
    /// Every this many seconds each open collection's files are read again and checked against
    /// their checksums (tantivy's footers, the dense manifest): a file changed on disk after it
    /// was verified is found within one interval (0: never).
    pub scrub_interval_s: u64,
    /// How fast the scrub reads (bytes per second; 0: as fast as the disk goes).
    pub scrub_bytes_per_second: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            commit_interval_ms: 1_000,
            writer_memory_bytes: 64 << 20,
            indexing_threads: 2,
            writer_threads: 4,
            max_open_writers: 8,
            writer_idle_ms: 10_000,
            max_open_collections: 1_000,
            scrub_interval_s: 3_600,
            scrub_bytes_per_second: 32 << 20,
        }
    }
}

/// Largest `dense.seal_vectors` (the dense index's own limit, `dense::MAX_SEAL_VECTORS`: a live
/// segment preallocates its slot tables).
pub const MAX_DENSE_SEAL_VECTORS: usize = 10_000_000;

/// The dense index of each collection (see `crate::dense`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DenseConfig {
    /// Vectors the live (in-memory) segment takes before it is sealed: dumped to disk, so an
    /// open loads it rather than inserting its vectors again.
    pub seal_vectors: usize,
    /// Share of dead vectors (deleted or replaced sections) past which a sealed segment is
    /// rebuilt from its live vectors, in the background.
    pub rebuild_dead_share: f32,
    /// Candidate list of a dense search in each segment (raised to the neighbours asked for):
    /// larger finds more of the exact nearest sections, at a cost growing with it. The list is
    /// that of hnsw_rs's plain search (see `dense::search::search_segment`).
    pub ef_search: usize,
    /// Sealed segments a collection's open loads at once (0: one per core). Side by side, a
    /// million sections open in 9–13 s instead of 14–16 s, and hold about 350 MiB more (the
    /// loads' interleaved allocations); 1 loads them one at a time.
    pub load_threads: usize,
    /// Vectors a background merge may build one sealed segment of (0: no limit). A lower limit
    /// keeps more, smaller graphs: higher recall against exact search, slower searches.
    pub max_segment_vectors: usize,
    /// A clean close (a stop, or an idle collection closed) seals the live segment only when it
    /// holds at least this many vectors; a smaller one is inserted again from the stored vectors
    /// at the next open, which costs less than writing its files, and a collection closed and
    /// opened often gathers no tiny segment at each close.
    pub close_seal_min_vectors: usize,
}

/// Segments a dense merge of one tier takes (the dense index's own `TIER_MERGE_FACTOR`): a
/// `dense.max_segment_vectors` below this many times `dense.seal_vectors` would stop every merge.
pub const DENSE_TIER_MERGE_FACTOR: usize = 4;

/// Largest `dense.load_threads`.
pub const MAX_DENSE_LOAD_THREADS: usize = 256;

/// Largest `dense.ef_search`.
pub const MAX_DENSE_EF_SEARCH: usize = 4096;

impl Default for DenseConfig {
    fn default() -> Self {
        Self {
            seal_vectors: 20_000,
            rebuild_dead_share: 0.25,
            ef_search: 640,
            load_threads: 0,
            max_segment_vectors: 0,
            close_seal_min_vectors: 256,
        }
    }
}
