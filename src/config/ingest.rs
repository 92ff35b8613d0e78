//! The `ingest` section: the single node's durable write queue (see `crate::write_queue`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Bytes of document text one collection's queue may hold waiting to be applied; a write
    /// past it is refused with RESOURCE_EXHAUSTED and a retry delay (a write into an empty queue
    /// is always taken).
    pub max_queued_bytes: u64,
    /// The same, over every collection.
    pub max_queued_bytes_total: u64,
    /// A write carrying a `write_id` seen within this many seconds answers the first write's
    /// operation and applies nothing.
    pub dedupe_window_s: u64,
    /// An ended operation's record is kept this many seconds (`GetOperation`, `ListOperations`).
    pub operations_retention_s: u64,
    /// An index worker embeds and applies an upsert in parts of about this many bytes of text:
    /// smaller parts show progress sooner and let queries in between.
    pub apply_batch_bytes: u64,
    /// Niceness (0..=19) of the index workers' threads, the index writers' threads (and the
    /// tantivy threads they start) and the model session writes embed with: above 0, queries
    /// get the cores first while a write is embedded (reads first); 0 shares the cores evenly.
    pub worker_nice: i32,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_queued_bytes: 1 << 30,
            max_queued_bytes_total: 4 << 30,
            dedupe_window_s: 24 * 3600,
            operations_retention_s: 24 * 3600,
            apply_batch_bytes: 64 << 10,
            worker_nice: 10,
        }
    }
}
