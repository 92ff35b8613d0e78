//! The single node's durable write queue: what an acknowledged write holds until an index worker
//! has applied it, and each write's operation record.
//!
//! One redb database, `data_dir/write-queue.redb`, holds four tables: the queued writes by
//! operation id (`queue`), every operation's record (`operations`), idempotency keys
//! (`write_ids`: collection and write id → operation id) and the next id (`meta`). A write is
//! acknowledged once the transaction that stores it has committed: redb's default durability
//! fsyncs before `commit` returns. Ids grow by one per write across collections; an operation's
//! id is also its consistency token. Each collection's writes are applied in id order by its
//! index worker (`service`), which takes the oldest with [`WriteQueue::next`], reports progress,
//! and ends it with [`WriteQueue::finish`]: one transaction removes the write and records the
//! outcome. A crash between the index's commit and that transaction applies the write again
//! after the restart, which changes nothing: an upsert of the same content and a delete are
//! idempotent, and no later write of the collection has been applied in between.
//!
//! What is pending is also kept in memory (per collection: ids, documents, bytes), for the
//! queue's bounds, waits, metrics and estimates; it is rebuilt from the records at open.

mod apply;
mod codec;
mod reads;
mod upkeep;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use redb::{Database, ReadableTable, TableDefinition};

use crate::error::{LatheError, Result, StorageFault};
use crate::ingest::SectionedDocument;
use crate::types::{Operation, OperationKind};

#[allow(clippy::all, missing_docs)]
mod proto {
    include!(concat!(env!("OUT_DIR"), "/lathe.queue.v1.rs"));
}

const QUEUE: TableDefinition<u64, &[u8]> = TableDefinition::new("queue");
const OPERATIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("operations");
const WRITE_IDS: TableDefinition<(&str, &str), u64> = TableDefinition::new("write_ids");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NEXT_ID: &str = "next_id";

/// The file the queue lives in, under the data dir.
pub const QUEUE_FILE: &str = "write-queue.redb";

/// Longest write id.
pub const MAX_WRITE_ID_BYTES: usize = 128;

/// A write as the queue holds it.
#[derive(Clone, Debug)]
pub enum QueuedWrite {
    /// Documents, cut into sections on the accept path.
    Upsert(Vec<SectionedDocument>),
    /// Document ids.
    Delete(Vec<String>),
}

impl QueuedWrite {
    /// A write as the queue stores it (a replica's work stream carries the same bytes).
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        codec::decode_write(bytes)
    }

    /// An upsert of `documents` cut into encoded writes of at most `max_bytes` each (in
    /// order); `None` when one document alone is larger.
    pub fn encode_upsert_pieces(
        documents: &[SectionedDocument],
        max_bytes: usize,
    ) -> Option<Vec<Vec<u8>>> {
        codec::encode_upsert_pieces(documents, max_bytes)
    }

    fn kind(&self) -> OperationKind {
        match self {
            Self::Upsert(_) => OperationKind::Upsert,
            Self::Delete(_) => OperationKind::Delete,
        }
    }

    /// Documents and bytes of text (ids, for deletes) it carries.
    pub fn size(&self) -> (u32, u64) {
        match self {
            Self::Upsert(documents) => (
                documents.len() as u32,
                documents
                    .iter()
                    .map(|d| (d.document.text.len() + d.document.title.len()) as u64)
                    .sum(),
            ),
            Self::Delete(ids) => (ids.len() as u32, ids.iter().map(|id| id.len() as u64).sum()),
        }
    }
}

/// The queue's bounds and windows (from `ingest`).
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    pub max_queued_bytes: u64,
    pub max_queued_bytes_total: u64,
    pub dedupe_window: Duration,
    pub retention: Duration,
}

/// What [`WriteQueue::enqueue`] did.
#[derive(Clone, Debug)]
pub struct Enqueued {
    pub operation: Operation,
    /// The write id was seen within the window: this is the first write's operation, and
    /// nothing was queued.
    pub deduplicated: bool,
}

/// One collection's pending writes, for metrics.
#[derive(Clone, Debug)]
pub struct Depth {
    pub collection: String,
    pub documents: u64,
    pub bytes: u64,
    pub oldest_unix_ms: u64,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    documents: u32,
    bytes: u64,
    created_unix_ms: u64,
}

#[derive(Clone, Debug)]
struct Running {
    started: Instant,
    started_unix_ms: u64,
    documents_done: u32,
    bytes_done: u64,
    /// Why the last try failed, while the worker retries it.
    retrying: Option<String>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    pending: HashMap<String, BTreeMap<u64, Pending>>,
    total_bytes: u64,
    running: HashMap<u64, Running>,
    /// Bytes per second of each collection's last applied upsert.
    rates: HashMap<String, f64>,
}

impl State {
    fn collection_bytes(&self, collection: &str) -> u64 {
        self.pending
            .get(collection)
            .map_or(0, |pending| pending.values().map(|p| p.bytes).sum())
    }
}

pub struct WriteQueue {
    db: Database,
    path: PathBuf,
    limits: QueueLimits,
    state: Mutex<State>,
    /// Bumped on every change: waits follow it.
    changes: tokio::sync::watch::Sender<u64>,
}

pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl WriteQueue {
    /// Opens (or creates) the queue in `data_dir` and reads what is pending.
    pub fn open(data_dir: &Path, limits: QueueLimits) -> Result<Self> {
        let path = data_dir.join(QUEUE_FILE);
        let db = Database::create(&path).at(&path)?;
        let queue = Self {
            db,
            path,
            limits,
            state: Mutex::new(State::default()),
            changes: tokio::sync::watch::Sender::new(0),
        };
        queue.load()?;
        queue.prune(SystemTime::now())?;
        Ok(queue)
    }

    fn load(&self) -> Result<()> {
        let txn = self.db.begin_write().at(&self.path)?;
        let mut state = self.lock();
        {
            // Opening the tables in a write transaction creates them on a new queue.
            let queue = txn.open_table(QUEUE).at(&self.path)?;
            let operations = txn.open_table(OPERATIONS).at(&self.path)?;
            txn.open_table(WRITE_IDS).at(&self.path)?;
            let meta = txn.open_table(META).at(&self.path)?;
            state.next_id = meta.get(NEXT_ID).at(&self.path)?.map_or(1, |v| v.value());
            for entry in queue.iter().at(&self.path)? {
                let (id, _) = entry.at(&self.path)?;
                let id = id.value();
                let Some(record) = operations.get(id).at(&self.path)? else {
                    return Err(LatheError::internal(format!(
                        "{}: queued write {id} has no operation record",
                        self.path.display()
                    )));
                };
                let record = codec::decode_record(record.value())?;
                state.total_bytes += record.bytes;
                state.pending.entry(record.collection).or_default().insert(
                    id,
                    Pending {
                        documents: record.documents,
                        bytes: record.bytes,
                        created_unix_ms: record.created_unix_ms,
                    },
                );
            }
        }
        txn.commit().at(&self.path)?;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Stores `write` for `collection` durably (committed, so fsync'd, before it returns) and
    /// answers its operation; with a `write_id` seen within the dedupe window, answers that
    /// write's operation and stores nothing. Past the queue's bounds: [`LatheError::QueueFull`].
    /// Blocking: call it off the async threads.
    pub fn enqueue(
        &self,
        collection: &str,
        write: &QueuedWrite,
        write_id: &str,
        now: SystemTime,
    ) -> Result<Enqueued> {
        let bytes_stored = codec::encode_write(write);
        let write_hash = crate::content_hash::content_hash([bytes_stored.as_slice()]);
        let (documents, bytes) = write.size();
        let now_ms = unix_ms(now);
        let mut state = self.lock();
        let txn = self.db.begin_write().at(&self.path)?;
        if !write_id.is_empty() {
            let write_ids = txn.open_table(WRITE_IDS).at(&self.path)?;
            let operations = txn.open_table(OPERATIONS).at(&self.path)?;
            let seen = write_ids
                .get((collection, write_id))
                .at(&self.path)?
                .map(|v| v.value());
            if let Some(first) = seen {
                if let Some(record) = operations.get(first).at(&self.path)? {
                    let record = codec::decode_record(record.value())?;
                    let window = self.limits.dedupe_window.as_millis() as u64;
                    if record.created_unix_ms + window > now_ms {
                        if record.write_hash != write_hash {
                            return Err(LatheError::invalid(
                                "write_id",
                                format!("`{write_id}` was used for a different write (operation {first}) within ingest.dedupe_window_s ({} s); give a new write a new write_id", self.limits.dedupe_window.as_secs()),
                            ));
                        }
                        let operation = self.with_progress(&state, first, &record);
                        return Ok(Enqueued {
                            operation,
                            deduplicated: true,
                        });
                    }
                }
            }
        }
        let queued_here = state.collection_bytes(collection);
        if queued_here > 0 && queued_here + bytes > self.limits.max_queued_bytes {
            return Err(self.full(
                &state,
                collection,
                "collection's",
                queued_here,
                bytes,
                "max_queued_bytes",
                self.limits.max_queued_bytes,
            ));
        }
        if state.total_bytes > 0 && state.total_bytes + bytes > self.limits.max_queued_bytes_total {
            return Err(self.full(
                &state,
                collection,
                "server's",
                state.total_bytes,
                bytes,
                "max_queued_bytes_total",
                self.limits.max_queued_bytes_total,
            ));
        }
        let id = state.next_id;
        let record = proto::OperationRecord {
            collection: collection.to_string(),
            kind: match write.kind() {
                OperationKind::Upsert => codec::KIND_UPSERT,
                OperationKind::Delete => codec::KIND_DELETE,
            },
            state: codec::STATE_QUEUED,
            documents,
            bytes,
            write_id: write_id.to_string(),
            write_hash,
            created_unix_ms: now_ms,
            ..Default::default()
        };
        {
            let mut queue = txn.open_table(QUEUE).at(&self.path)?;
            queue.insert(id, bytes_stored.as_slice()).at(&self.path)?;
            let mut operations = txn.open_table(OPERATIONS).at(&self.path)?;
            operations
                .insert(id, codec::encode_record(&record).as_slice())
                .at(&self.path)?;
            if !write_id.is_empty() {
                let mut write_ids = txn.open_table(WRITE_IDS).at(&self.path)?;
                write_ids
                    .insert((collection, write_id), id)
                    .at(&self.path)?;
            }
            let mut meta = txn.open_table(META).at(&self.path)?;
            meta.insert(NEXT_ID, id + 1).at(&self.path)?;
        }
        txn.commit().at(&self.path)?;
        state.next_id = id + 1;
        state.total_bytes += bytes;
        state
            .pending
            .entry(collection.to_string())
            .or_default()
            .insert(
                id,
                Pending {
                    documents,
                    bytes,
                    created_unix_ms: now_ms,
                },
            );
        let operation = self.with_progress(&state, id, &record);
        drop(state);
        self.changed();
        Ok(Enqueued {
            operation,
            deduplicated: false,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn full(
        &self,
        state: &State,
        collection: &str,
        scope: &str,
        queued: u64,
        bytes: u64,
        field: &'static str,
        limit: u64,
    ) -> LatheError {
        // Long enough for the writes ahead to drain at the collection's recent rate (1 s to a
        // minute; 5 s before there is a rate).
        let rate = state.rates.get(collection).copied().unwrap_or(0.0);
        let retry_after = if rate > 0.0 {
            Duration::from_secs_f64((bytes as f64 / rate).clamp(1.0, 60.0))
        } else {
            Duration::from_secs(5)
        };
        LatheError::QueueFull {
            scope: format!("the {scope} write queue"),
            queued,
            bytes,
            limit,
            field,
            retry_after,
        }
    }

    /// Collections with writes waiting.
    pub fn pending_collections(&self) -> Vec<String> {
        let state = self.lock();
        state
            .pending
            .iter()
            .filter(|(_, pending)| !pending.is_empty())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether `collection` has writes waiting.
    pub fn has_pending(&self, collection: &str) -> bool {
        self.lock()
            .pending
            .get(collection)
            .is_some_and(|p| !p.is_empty())
    }
}

/// A redb result, its error named for the queue file at `path` (see [`queue_error`]).
trait AtQueue<T> {
    fn at(self, path: &Path) -> Result<T>;
}

impl<T, E: Into<redb::Error>> AtQueue<T> for std::result::Result<T, E> {
    fn at(self, path: &Path) -> Result<T> {
        self.map_err(|e| queue_error(path, e))
    }
}

/// The queue file could not be read or written: the disk's fault, named as a collection's
/// would be (a full disk: RESOURCE_EXHAUSTED, writes resume once space is freed).
fn queue_error(path: &Path, error: impl Into<redb::Error>) -> LatheError {
    match error.into() {
        redb::Error::Io(io) => LatheError::Storage {
            collection: "(write queue)".into(),
            path: path.to_path_buf(),
            fault: StorageFault::of(&io),
            cause: io.to_string(),
        },
        other => LatheError::internal(format!("write queue {}: {other}", path.display())),
    }
}

#[cfg(test)]
mod tests;
