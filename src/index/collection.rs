//! One collection's coarse index: a tantivy index on disk, a single writer thread that applies
//! writes in order and commits them in groups, and an atomically swapped read snapshot.
//!
//! Atomicity: an upsert deletes the document's sections and adds the new ones between two commits,
//! and a batch is never split by a commit, so a query sees either the old or the new version of a
//! document, never a mix. Durability: a `wait` write is answered only after tantivy's commit (which
//! fsyncs the segment files and atomically replaces meta.json) and after the reader reloaded.
//!
//! Integrity (see `integrity`): the index lives in a [`VerifiedDirectory`], so every file is
//! checked against its footer checksum before tantivy reads it; a collection with a damaged file
//! opens *damaged*: it answers every read and write with DATA_LOSS naming the file, and serves
//! nothing. Stored sections are read with `schema::decode_stored_section` (bounded, verified
//! against the section's checksum), never with tantivy's document decoder.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tantivy::collector::{Count, TopDocs};
use tantivy::columnar::Column;
use tantivy::directory::OwnedBytes;
use tantivy::indexer::IndexWriterOptions;
use tantivy::query::{BooleanQuery, ConstScoreQuery, Occur, Query, TermQuery};
use tantivy::schema::IndexRecordOption;
use tantivy::store::StoreReader;
use tantivy::{DocAddress, Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, Term};
use tokio::sync::oneshot;

use super::integrity::{Integrity, VerifiedDirectory};
use super::schema::{self, SectionFields, StoredSection, HEADING_SEPARATOR, METADATA_SEPARATOR};
use super::storage;
use super::writer_pool::{JobState, Permit, SlotHandle, WriterJob, WriterPool};
use crate::dense::{DenseIndex, DenseIndexConfig};
use crate::embed::QuantizedVectors;
use crate::error::{LatheError, Result};
use crate::types::{CollectionStats, DenseStats, Filter};

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

/// Decompressed doc-store blocks cached per segment (tantivy's default for its own readers; the
/// searcher's are built without a cache since stored sections are read only through these).
const STORE_CACHE_BLOCKS: usize = 100;

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
    fn stored_bytes(
        &self,
        address: DocAddress,
    ) -> std::result::Result<(OwnedBytes, Option<u64>), String> {
        let stores = self.stores.get_or_init(|| {
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
        });
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
}

/// One section ready to be indexed.
#[derive(Clone, Debug)]
pub struct SectionRecord {
    pub ordinal: u64,
    pub heading_path: Vec<String>,
    pub text: String,
    pub byte_start: u64,
    pub char_start: u64,
    /// Stable id of this version of the section (see [`section_key`]).
    pub section_key: u64,
    /// Sentence byte ranges in `text`.
    pub sentences: Vec<Range<u32>>,
    /// `QuantizedVectors` bytes, one row per sentence; empty without the neural stage.
    pub sentence_vectors: Vec<u8>,
    /// One-row `QuantizedVectors` bytes of the section's vector; empty without the neural stage.
    pub section_vector: Vec<u8>,
}

/// The dense-index key of one version of one section.
pub fn section_key(doc_id: &str, ordinal: u64, version: u64) -> u64 {
    crate::content_hash::content_hash([
        doc_id.as_bytes(),
        &ordinal.to_le_bytes(),
        &version.to_le_bytes(),
    ])
}

/// One document's sections, all from one version.
#[derive(Clone, Debug)]
pub struct DocumentRecord {
    pub doc_id: String,
    pub title: String,
    pub metadata: BTreeMap<String, String>,
    pub text_bytes: u64,
    pub version: u64,
    pub sections: Vec<SectionRecord>,
}

#[derive(Clone, Debug)]
pub enum WriteOp {
    Upsert(DocumentRecord),
    Delete { doc_id: String },
}

/// A section found by the coarse search, with what re-chunking needs.
#[derive(Clone, Debug)]
pub struct SectionHit {
    pub score: f32,
    pub doc_id: String,
    pub ordinal: u64,
    pub version: u64,
    pub doc_title: String,
    pub heading_path: Vec<String>,
    pub text: String,
    pub byte_start: u64,
    pub char_start: u64,
    pub metadata: BTreeMap<String, String>,
    pub section_key: u64,
    pub sentences: Vec<Range<u32>>,
    /// `QuantizedVectors` bytes (empty without the neural stage).
    pub sentence_vectors: Vec<u8>,
}

pub enum WriterCommand {
    Apply {
        ops: Vec<WriteOp>,
        /// `Some` for a `wait` write: answered with the generation once durable and visible.
        done: Option<oneshot::Sender<Result<u64>>>,
    },
    /// Commit what is held, close the writer and finish; `done` is dropped once that is over.
    Shutdown { done: std::sync::mpsc::Sender<()> },
}

/// How the writers of every collection behave (from `[storage]` in the configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterSettings {
    /// Indexing arena of one open writer, in bytes (tantivy's minimum is 15 MB).
    pub memory_bytes: usize,
    /// Writes without `wait` are committed within this long.
    pub commit_interval: Duration,
    /// An open writer with nothing to commit is closed after this long without writes.
    pub idle_close: Duration,
    /// Worker threads shared by every collection's writes and commits.
    pub threads: usize,
    /// Index writers open at once; past that, the least recently used idle one is closed.
    pub max_open_writers: usize,
}

/// The shared writer workers (one per catalog).
pub type CollectionWriterPool = WriterPool<CollectionWriter>;

pub struct CollectionIndex {
    index: Index,
    fields: SectionFields,
    snapshot: Arc<RwLock<Arc<Snapshot>>>,
    writer: SlotHandle<CollectionWriter>,
    path: PathBuf,
    /// Section vectors (when the neural stage is on); kept in step with the snapshot by the writer.
    dense: Option<Arc<RwLock<DenseIndex>>>,
    /// See [`CollectionIndex::changes`].
    changes: Arc<AtomicU64>,
    /// The pool of a standalone index (see [`CollectionIndex::open_or_create`]); dropped after
    /// the writer finished.
    own_pool: Option<CollectionWriterPool>,
    /// What was found wrong with the collection's stored data (see [`CollectionIndex::damage`]).
    integrity: Arc<Integrity>,
}

impl CollectionIndex {
    /// Opens the index in `path`, creating it when absent, with a private writer pool of one
    /// thread (for tools and tests that open one index; the server's catalog shares one pool
    /// among all collections, see [`CollectionIndex::open`]).
    pub fn open_or_create(
        path: &Path,
        writer_memory_bytes: usize,
        commit_interval: Duration,
        dense_dim: Option<usize>,
    ) -> Result<Self> {
        let settings = WriterSettings {
            memory_bytes: writer_memory_bytes,
            commit_interval,
            idle_close: Duration::from_secs(60),
            threads: 1,
            max_open_writers: 1,
        };
        let pool = WriterPool::new(1, 1, "lathe-writer")
            .map_err(|e| LatheError::io("spawning the index writer thread", e))?;
        // `collections/<name>/index` in a data dir; any other folder names itself.
        let folder_name = |path: &Path| {
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let name = match path.parent() {
            Some(parent) if path.ends_with("index") => folder_name(parent),
            _ => folder_name(path),
        };
        let mut index = Self::open(path, &name, dense_dim, &settings, &pool)?;
        index.own_pool = Some(pool);
        Ok(index)
    }

    /// Opens the index of collection `name` in `path`, creating it when absent; its writes are
    /// applied by `pool`, whose workers open a tantivy writer only while the collection is
    /// being written. `dense_dim`: the dimension of section vectors when the neural stage is
    /// on; the dense index is rebuilt from the vectors stored in tantivy, the one source of
    /// truth.
    pub fn open(
        path: &Path,
        name: &str,
        dense_dim: Option<usize>,
        settings: &WriterSettings,
        pool: &CollectionWriterPool,
    ) -> Result<Self> {
        let (schema, fields) = schema::build_schema();
        std::fs::create_dir_all(path).map_err(|e| storage::io_write_error(name, path, &e))?;
        let integrity = Integrity::new(name);
        let directory = storage::IndexDirectory::open(path)
            .map_err(|e| LatheError::internal(format!("opening {}: {e}", path.display())))?;
        let directory = VerifiedDirectory::new(directory, Arc::clone(&integrity));
        let index = match Index::open_or_create(directory, schema) {
            Ok(index) => index,
            Err(tantivy::TantivyError::SchemaError(reason)) => {
                return Err(LatheError::IncompatibleIndex {
                    collection: name.to_string(),
                    reason: format!(
                        "its index in {} has another schema ({reason}): it was written by an \
                         earlier version of Lathe, without per-section checksums; delete the \
                         collection, create it again and upsert its documents",
                        path.display()
                    ),
                })
            }
            Err(error) => return Err(storage::write_error(name, path, error)),
        };
        schema::register_analyzer(&index);
        // Opening the reader opens every segment file, each verified against its footer first.
        let reader: std::result::Result<IndexReader, _> = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .doc_store_cache_num_blocks(0)
            .try_into();
        let reader = match (reader, integrity.damage()) {
            (Ok(reader), None) => reader,
            (_, Some(damage)) => {
                return Err(LatheError::DataLoss {
                    collection: name.to_string(),
                    documents: Vec::new(),
                    detail: damage,
                })
            }
            (Err(error), None) => return Err(error.into()),
        };
        let generation = index.load_metas()?.opstamp;
        let first_snapshot = Snapshot::new(reader.searcher(), generation);
        let dense = match dense_dim {
            None => None,
            Some(dim) => Some(Arc::new(RwLock::new(rebuild_dense(
                &first_snapshot,
                &fields,
                dim,
                &integrity,
            )?))),
        };
        let snapshot = Arc::new(RwLock::new(Arc::new(first_snapshot)));
        let changes = Arc::new(AtomicU64::new(0));
        let writer = pool.register(CollectionWriter {
            collection: name.to_string(),
            path: path.to_path_buf(),
            index: index.clone(),
            settings: settings.clone(),
            writer: None,
            reader,
            fields,
            snapshot: Arc::clone(&snapshot),
            dense: dense.clone(),
            pending_dense: HashMap::new(),
            changes: Arc::clone(&changes),
            waiters: Vec::new(),
            dirty_since: None,
            last_write: Instant::now(),
        });
        Ok(Self {
            index,
            fields,
            snapshot,
            writer,
            path: path.to_path_buf(),
            dense,
            changes,
            own_pool: None,
            integrity,
        })
    }

    /// `Some(reason)` once this process found any of the collection's stored data failing
    /// verification: a new segment file when a commit or merge first opened it (reads go on from
    /// the last good snapshot; that commit failed), or a stored section read by a query (that
    /// document answers DATA_LOSS; others are served, each verified). The first finding, and how
    /// many more. `None` while everything read so far verified. (A file failing at open makes
    /// `open` fail: the catalog lists the collection as damaged.)
    pub fn damage(&self) -> Option<String> {
        self.integrity.damage()
    }

    /// A counter the writer makes odd when a commit starts changing the dense index and even
    /// again once the new snapshot is in place. A query that read the same even value before
    /// taking its snapshot and after its last stage ran against one consistent state of both
    /// indexes; only such an answer may be cached under its generation.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        // A poisoned lock only means a writer panicked mid-swap; the Arc inside is still whole.
        let guard = self
            .snapshot
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&guard)
    }

    /// Hands `ops` to the writer. Returns a receiver for the visible generation when `wait`.
    pub fn write(
        &self,
        ops: Vec<WriteOp>,
        wait: bool,
    ) -> Result<Option<oneshot::Receiver<Result<u64>>>> {
        let (done, receiver) = if wait {
            let (sender, receiver) = oneshot::channel();
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        self.writer
            .submit(WriterCommand::Apply { ops, done })
            .map_err(|_| LatheError::Unavailable("the collection's writer has stopped".into()))?;
        Ok(receiver)
    }

    /// Asks the writer to commit what it holds and stop; [`CollectionIndex::shutdown`] waits for
    /// it. Asking every collection first lets the pool's workers stop them side by side.
    pub fn begin_shutdown(&self) -> std::sync::mpsc::Receiver<()> {
        let (done, finished) = std::sync::mpsc::channel();
        // Refused when already stopped: `done` is dropped, so waiting returns at once.
        let _ = self.writer.submit(WriterCommand::Shutdown { done });
        finished
    }

    /// Stops the writer after committing what it holds.
    pub fn shutdown(&self) {
        // Returns when the writer drops `done` (after its last commit), whatever the outcome.
        let _ = self.begin_shutdown().recv();
    }

    /// Analysed terms of `text`, deduplicated, in first-seen order.
    pub fn query_terms(&self, text: &str) -> Vec<String> {
        let mut analyzer = schema::analyzer();
        let mut stream = analyzer.token_stream(text);
        let mut seen = HashSet::new();
        let mut terms = Vec::new();
        while stream.advance() {
            let term = &stream.token().text;
            if seen.insert(term.clone()) {
                terms.push(term.clone());
            }
        }
        terms
    }

    /// BM25 over section text and titles for `terms`, restricted by `filter`; best `limit` first.
    pub fn search(
        &self,
        snapshot: &Snapshot,
        terms: &[String],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<SectionHit>> {
        if terms.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let fields = &self.fields;
        let mut should: Vec<(Occur, Box<dyn Query>)> = Vec::with_capacity(terms.len() * 2);
        for term in terms {
            for field in [fields.text, fields.title_text] {
                let term = Term::from_field_text(field, term);
                should.push((
                    Occur::Should,
                    Box::new(TermQuery::new(term, IndexRecordOption::WithFreqs)),
                ));
            }
        }
        let mut clauses: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, Box::new(BooleanQuery::new(should)))];
        clauses.extend(self.filter_clauses(filter));
        let query = BooleanQuery::new(clauses);
        let top = snapshot
            .searcher
            .search(&query, &TopDocs::with_limit(limit).order_by_score())?;
        top.into_iter()
            .map(|(score, address)| self.load_hit(snapshot, score, address))
            .collect()
    }

    /// Constant-zero clauses that hold `filter` (metadata terms, doc ids) in either leg.
    fn filter_clauses(&self, filter: &Filter) -> Vec<(Occur, Box<dyn Query>)> {
        let fields = &self.fields;
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for (key, value) in &filter.metadata {
            let term = Term::from_field_text(fields.metadata_terms, &metadata_term(key, value));
            clauses.push((
                Occur::Must,
                constant_zero(TermQuery::new(term, IndexRecordOption::Basic)),
            ));
        }
        if !filter.doc_ids.is_empty() {
            let ids: Vec<(Occur, Box<dyn Query>)> = filter
                .doc_ids
                .iter()
                .map(|id| {
                    let term = Term::from_field_text(fields.doc_id, id);
                    (
                        Occur::Should,
                        Box::new(TermQuery::new(term, IndexRecordOption::Basic)) as Box<dyn Query>,
                    )
                })
                .collect();
            clauses.push((Occur::Must, constant_zero(BooleanQuery::new(ids))));
        }
        clauses
    }

    pub fn has_dense(&self) -> bool {
        self.dense.is_some()
    }

    /// The sections nearest to `query` in the dense index that are in `snapshot` and pass
    /// `filter`, best first, scored by cosine similarity.
    pub fn search_dense(
        &self,
        snapshot: &Snapshot,
        query: &[f32],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<SectionHit>> {
        let Some(dense) = &self.dense else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Filters are checked in tantivy; ask for more neighbours when they may drop some.
        let unfiltered = filter.metadata.is_empty() && filter.doc_ids.is_empty();
        let wanted = if unfiltered {
            limit
        } else {
            (limit * 8).max(64)
        };
        let neighbours = dense
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .search(query, wanted, &|_| true)
            .map_err(|e| LatheError::internal(format!("dense search: {e}")))?;
        if neighbours.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<(Occur, Box<dyn Query>)> = neighbours
            .iter()
            .map(|(key, _)| {
                let term = Term::from_field_u64(self.fields.section_key, *key);
                (
                    Occur::Should,
                    Box::new(TermQuery::new(term, IndexRecordOption::Basic)) as Box<dyn Query>,
                )
            })
            .collect();
        let mut clauses: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, constant_zero(BooleanQuery::new(keys)))];
        clauses.extend(self.filter_clauses(filter));
        let found = snapshot.searcher.search(
            &BooleanQuery::new(clauses),
            &TopDocs::with_limit(neighbours.len()).order_by_score(),
        )?;
        let similarity: HashMap<u64, f32> = neighbours.into_iter().collect();
        let mut hits = found
            .into_iter()
            .map(|(_, address)| self.load_hit(snapshot, 0.0, address))
            .collect::<Result<Vec<_>>>()?;
        for hit in &mut hits {
            hit.score = similarity.get(&hit.section_key).copied().unwrap_or(0.0);
        }
        hits.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.section_key.cmp(&b.section_key))
        });
        hits.truncate(limit);
        Ok(hits)
    }

    /// The section at `address`, verified (see [`CollectionIndex::read_section`]).
    fn load_hit(&self, snapshot: &Snapshot, score: f32, address: DocAddress) -> Result<SectionHit> {
        let stored = self.stored_bytes(snapshot, address)?;
        let section = self.read_section(snapshot, address, &stored)?;
        let metadata = serde_json::from_str(section.metadata_json).map_err(|error| {
            // The checksum matched: this JSON is what the writer serialised.
            LatheError::internal(format!("stored metadata of `{}`: {error}", section.doc_id))
        })?;
        Ok(SectionHit {
            score,
            doc_id: section.doc_id.to_string(),
            ordinal: section.ordinal,
            version: section.version,
            doc_title: section.doc_title.to_string(),
            heading_path: if section.heading_path.is_empty() {
                Vec::new()
            } else {
                section
                    .heading_path
                    .split(HEADING_SEPARATOR)
                    .map(str::to_string)
                    .collect()
            },
            text: section.text.to_string(),
            byte_start: section.byte_start,
            char_start: section.char_start,
            metadata,
            section_key: section.section_key,
            sentences: schema::decode_ranges(section.sentence_ranges),
            sentence_vectors: section.sentence_vectors.to_vec(),
        })
    }

    /// The doc-store bytes of the section at `address` and the key of the section that position
    /// holds, or DATA_LOSS naming its document.
    fn stored_bytes(
        &self,
        snapshot: &Snapshot,
        address: DocAddress,
    ) -> Result<(OwnedBytes, Option<u64>)> {
        snapshot
            .stored_bytes(address)
            .map_err(|why| self.damaged_section(snapshot, address, why))
    }

    /// Decodes `stored` (read for `address`) and verifies it: the section exactly as it was
    /// written, and the one at that position, or DATA_LOSS naming its document.
    fn read_section<'b>(
        &self,
        snapshot: &Snapshot,
        address: DocAddress,
        stored: &'b (OwnedBytes, Option<u64>),
    ) -> Result<StoredSection<'b>> {
        let (bytes, expected_key) = stored;
        verified_section(bytes, *expected_key, &self.fields)
            .map_err(|why| self.damaged_section(snapshot, address, why))
    }

    /// Records a section that failed verification and builds the caller's DATA_LOSS. The document
    /// is named from the `doc_id` fast field (in another, verified file), not from the damaged
    /// stored bytes.
    fn damaged_section(&self, snapshot: &Snapshot, address: DocAddress, why: String) -> LatheError {
        let segment = snapshot.searcher.segment_reader(address.segment_ord);
        let store_file = format!("{}.store", segment.segment_id().uuid_string());
        let document = stored_document_id(&snapshot.searcher, address)
            .unwrap_or_else(|| format!("at {store_file} position {}", address.doc_id));
        self.integrity.record(format!(
            "document `{document}` (in index file `{store_file}`): {why}"
        ));
        LatheError::DataLoss {
            collection: self.integrity.collection().to_string(),
            documents: vec![document],
            detail: format!(
                "{why}; upsert the document again or restore the collection from a backup"
            ),
        }
    }

    /// `ln(1 + (N - n + 0.5) / (n + 0.5))` of each term over section text, as tantivy's BM25 has it.
    pub fn idf(&self, snapshot: &Snapshot, terms: &[String]) -> Result<Vec<f32>> {
        let total = snapshot.searcher.num_docs() as f32;
        terms
            .iter()
            .map(|term| {
                let n = snapshot
                    .searcher
                    .doc_freq(&Term::from_field_text(self.fields.text, term))?
                    as f32;
                Ok((1.0 + (total - n + 0.5) / (n + 0.5)).ln())
            })
            .collect()
    }

    pub fn stats(&self) -> Result<CollectionStats> {
        let snapshot = self.snapshot();
        let searcher = &snapshot.searcher;
        let head = TermQuery::new(
            Term::from_field_u64(self.fields.head, 1),
            IndexRecordOption::Basic,
        );
        let documents = searcher.search(&head, &Count)? as u64;
        let mut bytes = 0u64;
        for segment in searcher.segment_readers() {
            let column = segment.fast_fields().u64("doc_bytes")?;
            for doc in segment.doc_ids_alive() {
                bytes += column.first(doc).unwrap_or(0);
            }
        }
        let dense = match &self.dense {
            None => None,
            Some(dense) => {
                let dense = dense.read().unwrap_or_else(|p| p.into_inner());
                let mut sections_with_vector = 0u64;
                for segment in searcher.segment_readers() {
                    let keys = segment.fast_fields().u64("section_key")?;
                    for doc in segment.doc_ids_alive() {
                        if keys.first(doc).is_some_and(|key| dense.contains(key)) {
                            sections_with_vector += 1;
                        }
                    }
                }
                Some(DenseStats {
                    vectors: dense.len() as u64,
                    sections_with_vector,
                })
            }
        };
        Ok(CollectionStats {
            documents,
            sections: searcher.num_docs(),
            bytes,
            generation: snapshot.generation,
            dense,
        })
    }

    /// Every live section of `doc_id` as (ordinal, version), for consistency checks.
    pub fn document_sections(&self, doc_id: &str) -> Result<Vec<(u64, u64)>> {
        let snapshot = self.snapshot();
        let query = TermQuery::new(
            Term::from_field_text(self.fields.doc_id, doc_id),
            IndexRecordOption::Basic,
        );
        let hits = snapshot
            .searcher
            .search(&query, &TopDocs::with_limit(1_000_000).order_by_score())?;
        let mut sections = Vec::with_capacity(hits.len());
        for (_, address) in hits {
            let stored = self.stored_bytes(&snapshot, address)?;
            let section = self.read_section(&snapshot, address, &stored)?;
            sections.push((section.ordinal, section.version));
        }
        sections.sort_unstable();
        Ok(sections)
    }

    pub fn index(&self) -> &Index {
        &self.index
    }
}

impl Drop for CollectionIndex {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub fn metadata_term(key: &str, value: &str) -> String {
    format!("{key}{METADATA_SEPARATOR}{value}")
}

/// Builds the dense index from the section vectors stored in every live section. A section that
/// fails verification is recorded and left out (reading its document answers DATA_LOSS anyway).
fn rebuild_dense(
    snapshot: &Snapshot,
    fields: &SectionFields,
    dim: usize,
    integrity: &Integrity,
) -> Result<DenseIndex> {
    let mut vectors: Vec<(u64, Vec<f32>)> = Vec::new();
    let searcher = &snapshot.searcher;
    for (segment_ord, segment) in searcher.segment_readers().iter().enumerate() {
        for doc in segment.doc_ids_alive() {
            let address = DocAddress::new(segment_ord as u32, doc);
            let section = snapshot
                .stored_bytes(address)
                .and_then(|(bytes, expected_key)| {
                    verified_section(&bytes, expected_key, fields).map(|section| {
                        (
                            section.section_key,
                            decode_one_vector(section.section_vector),
                        )
                    })
                });
            match section {
                Ok((key, Some(vector))) if vector.len() == dim => vectors.push((key, vector)),
                Ok(_) => {}
                Err(why) => {
                    let document = stored_document_id(searcher, address)
                        .unwrap_or_else(|| format!("at segment {segment_ord} position {doc}"));
                    integrity.record(format!("document `{document}`: {why}"));
                }
            }
        }
    }
    let mut config = DenseIndexConfig::new(dim);
    config.capacity_hint = config.capacity_hint.max(vectors.len() * 2);
    let mut dense =
        DenseIndex::new(config).map_err(|e| LatheError::internal(format!("dense index: {e}")))?;
    let started = Instant::now();
    dense
        .insert_many(
            vectors
                .iter()
                .map(|(key, vector)| (*key, vector.as_slice())),
        )
        .map_err(|e| LatheError::internal(format!("dense index: {e}")))?;
    tracing::info!(
        vectors = vectors.len(),
        seconds = started.elapsed().as_secs_f32(),
        "dense index rebuilt"
    );
    Ok(dense)
}

/// Decodes and verifies a stored section read for a position whose `section_key` fast field says
/// `expected_key`: intact (its checksum) and the section that belongs there (a damaged block
/// index could hand out another section's bytes, intact but not the ones asked for).
fn verified_section<'b>(
    bytes: &'b OwnedBytes,
    expected_key: Option<u64>,
    fields: &SectionFields,
) -> std::result::Result<StoredSection<'b>, String> {
    let section = schema::decode_stored_section(bytes.as_slice(), fields)
        .map_err(|damage| damage.to_string())?;
    match expected_key {
        Some(key) if key == section.section_key => Ok(section),
        Some(key) => Err(format!(
            "its stored bytes are those of another section (key {:016x}, not {key:016x})",
            section.section_key
        )),
        None => Err("the `section_key` fast field has no key at its position".to_string()),
    }
}

/// Runs `read` (tantivy decoding doc-store bytes), turning a panic into an error message.
fn catch_panic<T>(read: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read))
        .map_err(|_| "its doc-store block is damaged (decoding it panicked)".to_string())
}

/// The document id of the section at `address`, from the `doc_id` fast field: readable when the
/// section's stored bytes are not.
fn stored_document_id(searcher: &Searcher, address: DocAddress) -> Option<String> {
    let segment = searcher.segment_reader(address.segment_ord);
    let column = segment.fast_fields().str("doc_id").ok()??;
    let ordinal = column.term_ords(address.doc_id).next()?;
    let mut document = String::new();
    column
        .ord_to_str(ordinal, &mut document)
        .ok()?
        .then_some(document)
}

/// The first row of one `QuantizedVectors` blob.
fn decode_one_vector(bytes: &[u8]) -> Option<Vec<f32>> {
    let vectors = QuantizedVectors::from_bytes(bytes).ok()?;
    if vectors.is_empty() {
        return None;
    }
    let mut out = vec![0.0; vectors.dim()];
    vectors.row_into(0, &mut out).ok()?;
    Some(out)
}

fn constant_zero(query: impl Query) -> Box<dyn Query> {
    Box::new(ConstScoreQuery::new(Box::new(query), 0.0))
}

/// A section's dense-index key and vector.
type KeyedVector = (u64, Vec<f32>);

/// One collection's writer, run by the shared [`WriterPool`]: applies writes in order, commits
/// them in groups (at once for `wait` writes, else within the commit interval) and swaps in the
/// new snapshot. Its tantivy `IndexWriter` (one indexing thread, one merge thread, the segment
/// updater, an arena of `memory_bytes` and a file lock) is opened on the first write and closed
/// once the collection has been idle for `idle_close`, so an idle collection costs no thread.
pub struct CollectionWriter {
    collection: String,
    /// The index folder, named in storage errors.
    path: PathBuf,
    index: Index,
    settings: WriterSettings,
    /// Open only while the collection is being written (and holds a pool permit meanwhile).
    writer: Option<IndexWriter>,
    reader: IndexReader,
    fields: SectionFields,
    snapshot: Arc<RwLock<Arc<Snapshot>>>,
    dense: Option<Arc<RwLock<DenseIndex>>>,
    /// Documents written since the last commit: their new section vectors, or `None` if deleted.
    pending_dense: HashMap<String, Option<Vec<KeyedVector>>>,
    /// See [`CollectionIndex::changes`].
    changes: Arc<AtomicU64>,
    /// `wait` writes applied but not yet committed.
    waiters: Vec<oneshot::Sender<Result<u64>>>,
    /// When the oldest uncommitted write was applied.
    dirty_since: Option<Instant>,
    /// When the last command arrived, for closing the writer once idle.
    last_write: Instant,
}

impl WriterJob for CollectionWriter {
    type Command = WriterCommand;

    fn run(&mut self, commands: Vec<WriterCommand>, permit: &mut Permit<'_, Self>) -> JobState {
        let mut shutdown: Vec<std::sync::mpsc::Sender<()>> = Vec::new();
        if !commands.is_empty() {
            self.last_write = Instant::now();
        }
        // Group commit: everything queued since the last run is applied before committing.
        for command in commands {
            match command {
                WriterCommand::Apply { ops, done } => self.apply(ops, done, permit),
                WriterCommand::Shutdown { done } => shutdown.push(done),
            }
        }
        let interval_passed = self
            .dirty_since
            .is_some_and(|since| since.elapsed() >= self.settings.commit_interval);
        let stopping = !shutdown.is_empty();
        if !self.waiters.is_empty() || interval_passed || (stopping && self.dirty_since.is_some()) {
            self.commit();
        }
        if stopping {
            self.close_index_writer();
            return JobState {
                writer_open: false,
                wake_at: None,
                finished: true,
            };
        }
        if self.dirty_since.is_none() && self.last_write.elapsed() >= self.settings.idle_close {
            self.close_index_writer();
        }
        self.state()
    }

    fn close_writer(&mut self) -> JobState {
        if self.dirty_since.is_some() {
            self.commit();
        }
        self.close_index_writer();
        self.state()
    }
}

impl CollectionWriter {
    fn state(&self) -> JobState {
        let wake_at = match (self.dirty_since, &self.writer) {
            (Some(since), _) => Some(since + self.settings.commit_interval),
            (None, Some(_)) => Some(self.last_write + self.settings.idle_close),
            (None, None) => None,
        };
        JobState {
            writer_open: self.writer.is_some(),
            wake_at,
            finished: false,
        }
    }

    /// Opens the tantivy writer if it is closed (taking a pool permit first).
    fn ensure_index_writer(&mut self, permit: &mut Permit<'_, Self>) -> Result<()> {
        if self.writer.is_some() {
            return Ok(());
        }
        permit.acquire();
        // One indexing thread and one merge thread: writes to one collection come from one
        // worker anyway, and many collections may have a writer open at once.
        let options = IndexWriterOptions::builder()
            .num_worker_threads(1)
            .num_merge_threads(1)
            .memory_budget_per_thread(self.settings.memory_bytes)
            .build();
        let writer = self
            .index
            .writer_with_options(options)
            .map_err(|e| storage::write_error(&self.collection, &self.path, e))?;
        tracing::debug!(collection = %self.collection, "index writer opened");
        self.writer = Some(writer);
        Ok(())
    }

    /// Closes the tantivy writer after its merges finished (uncommitted writes must have been
    /// committed or abandoned before).
    fn close_index_writer(&mut self) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        if let Err(error) = writer.wait_merging_threads() {
            tracing::warn!(collection = %self.collection, %error, "a merge failed while closing the index writer");
        }
        tracing::debug!(collection = %self.collection, "index writer closed");
    }

    /// Drops the tantivy writer and everything uncommitted after a failure, and answers every
    /// waiter with `error`. The next write opens a fresh writer, so it meets the real cause (a
    /// full disk, a read-only mount) again rather than a writer killed by the last one.
    fn abandon_uncommitted(&mut self, error: &LatheError) {
        drop(self.writer.take());
        self.pending_dense.clear();
        self.dirty_since = None;
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(Err(error.for_another_caller()));
        }
    }

    fn apply(
        &mut self,
        ops: Vec<WriteOp>,
        done: Option<oneshot::Sender<Result<u64>>>,
        permit: &mut Permit<'_, Self>,
    ) {
        let result = if ops.is_empty() {
            Ok(())
        } else {
            self.ensure_index_writer(permit)
                .and_then(|()| ops.into_iter().try_for_each(|op| self.apply_one(op)))
        };
        let Err(error) = result else {
            self.dirty_since.get_or_insert_with(Instant::now);
            if let Some(done) = done {
                self.waiters.push(done);
            }
            return;
        };
        let error = self.cause_of_failed_write(error);
        tracing::error!(collection = %self.collection, %error, "applying a write failed, dropping uncommitted writes");
        // Drop the writer so that no half-applied batch can be committed later.
        self.abandon_uncommitted(&error);
        if let Some(done) = done {
            let _ = done.send(Err(error));
        }
    }

    /// A writer whose indexing thread died (on a full disk, when its arena filled and it
    /// flushed a segment) answers every later write with "An index writer was killed"; the
    /// thread's own error comes back only when it is joined, which preparing a commit does.
    fn cause_of_failed_write(&mut self, error: LatheError) -> LatheError {
        if !matches!(
            error,
            LatheError::Index(tantivy::TantivyError::ErrorInThread(_))
        ) {
            return error;
        }
        let Some(writer) = self.writer.as_mut() else {
            return error;
        };
        match writer.prepare_commit() {
            // Never committed: the writer is dropped right after.
            Ok(_prepared) => error,
            Err(cause) => storage::write_error(&self.collection, &self.path, cause),
        }
    }

    fn apply_one(&mut self, op: WriteOp) -> Result<()> {
        let fields = self.fields;
        let Some(writer) = &self.writer else {
            return Err(LatheError::internal(
                "a write was applied with no index writer open",
            ));
        };
        match op {
            WriteOp::Delete { doc_id } => {
                writer.delete_term(Term::from_field_text(fields.doc_id, &doc_id));
                // The commit tombstones the document's section vectors too: left live in hnsw,
                // they would crowd the live sections out of the nearest neighbours.
                if self.dense.is_some() {
                    self.pending_dense.insert(doc_id, None);
                }
            }
            WriteOp::Upsert(document) => {
                writer.delete_term(Term::from_field_text(fields.doc_id, &document.doc_id));
                let metadata_json = serde_json::to_string(&document.metadata)
                    .map_err(|e| LatheError::internal(format!("serialising metadata: {e}")))?;
                let title_prefix = document.title.clone();
                if self.dense.is_some() {
                    let vectors = document
                        .sections
                        .iter()
                        .filter_map(|section| {
                            decode_one_vector(&section.section_vector)
                                .map(|v| (section.section_key, v))
                        })
                        .collect();
                    self.pending_dense
                        .insert(document.doc_id.clone(), Some(vectors));
                }
                for section in document.sections {
                    let heading = section.heading_path.join(&HEADING_SEPARATOR.to_string());
                    let sentence_ranges = schema::encode_ranges(&section.sentences);
                    // Everything stored, with its checksum; then what is only indexed.
                    let mut doc = StoredSection {
                        doc_id: &document.doc_id,
                        ordinal: section.ordinal,
                        version: document.version,
                        doc_title: &document.title,
                        heading_path: &heading,
                        text: &section.text,
                        byte_start: section.byte_start,
                        char_start: section.char_start,
                        metadata_json: &metadata_json,
                        section_key: section.section_key,
                        sentence_ranges: &sentence_ranges,
                        sentence_vectors: &section.sentence_vectors,
                        section_vector: &section.section_vector,
                    }
                    .to_document(&fields);
                    if section.ordinal == 0 {
                        doc.add_u64(fields.head, 1);
                        doc.add_u64(fields.doc_bytes, document.text_bytes);
                    }
                    doc.add_text(
                        fields.title_text,
                        format!("{title_prefix} {}", section.heading_path.join(" ")),
                    );
                    for (key, value) in &document.metadata {
                        doc.add_text(fields.metadata_terms, metadata_term(key, value));
                    }
                    writer
                        .add_document(doc)
                        .map_err(|e| storage::write_error(&self.collection, &self.path, e))?;
                }
            }
        }
        Ok(())
    }

    /// Commits what was applied, answers the waiters, and on failure drops the writer and the
    /// uncommitted writes (see [`CollectionWriter::abandon_uncommitted`]).
    fn commit(&mut self) {
        self.dirty_since = None;
        if self.writer.is_none() {
            // Closed writer: everything applied was committed (a sync waits for nothing).
            let generation = self
                .snapshot
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .generation;
            for waiter in self.waiters.drain(..) {
                let _ = waiter.send(Ok(generation));
            }
            return;
        }
        // The sections these documents had before this commit, read from the last snapshot.
        let replaced_keys = self.replaced_section_keys();
        // Odd from here until the new snapshot is in place (or the commit failed).
        self.changes.fetch_add(1, Ordering::SeqCst);
        let committed = match self.writer.as_mut() {
            Some(writer) => writer
                .commit()
                .map_err(|e| storage::write_error(&self.collection, &self.path, e)),
            None => Err(LatheError::internal("no index writer to commit")),
        };
        let result = committed.and_then(|opstamp| {
            // Dense index first, then the new snapshot: a query never sees a section whose
            // vector is missing (stale neighbours are dropped by the tantivy lookup).
            self.apply_dense(replaced_keys)?;
            self.reader.reload()?;
            let snapshot = Arc::new(Snapshot::new(self.reader.searcher(), opstamp));
            *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = snapshot;
            Ok(opstamp)
        });
        self.changes.fetch_add(1, Ordering::SeqCst);
        match result {
            Ok(generation) => {
                tracing::debug!(generation, waiters = self.waiters.len(), "committed");
                for waiter in self.waiters.drain(..) {
                    let _ = waiter.send(Ok(generation));
                }
            }
            Err(error) => {
                tracing::error!(collection = %self.collection, %error, "commit failed, dropping uncommitted writes");
                self.abandon_uncommitted(&error);
            }
        }
    }

    fn replaced_section_keys(&self) -> Vec<u64> {
        if self.dense.is_none() || self.pending_dense.is_empty() {
            return Vec::new();
        }
        let searcher = self.reader.searcher();
        let mut keys = Vec::new();
        for doc_id in self.pending_dense.keys() {
            let query = TermQuery::new(
                Term::from_field_text(self.fields.doc_id, doc_id),
                IndexRecordOption::Basic,
            );
            let Ok(found) =
                searcher.search(&query, &TopDocs::with_limit(1_000_000).order_by_score())
            else {
                continue;
            };
            // From the fast field: no stored bytes are decoded on the writer thread.
            for (_, address) in found {
                let segment = searcher.segment_reader(address.segment_ord);
                if let Ok(column) = segment.fast_fields().u64("section_key") {
                    keys.extend(column.first(address.doc_id));
                }
            }
        }
        keys
    }

    fn apply_dense(&mut self, replaced_keys: Vec<u64>) -> Result<()> {
        let Some(dense) = &self.dense else {
            return Ok(());
        };
        let needs_rebuild = {
            let mut dense = dense.write().unwrap_or_else(|p| p.into_inner());
            for key in replaced_keys {
                dense.delete(key);
            }
            for (_, vectors) in self.pending_dense.drain() {
                for (key, vector) in vectors.into_iter().flatten() {
                    dense
                        .insert(key, &vector)
                        .map_err(|e| LatheError::internal(format!("dense insert: {e}")))?;
                }
            }
            dense.needs_rebuild()
        };
        if needs_rebuild {
            // Compaction rebuilds the whole graph (seconds for thousands of sections). This thread
            // is the dense index's only writer, so nothing changes it while the fresh graph is
            // built from a copy of its live vectors: queries keep searching the old graph under
            // the read lock and wait only for the swap.
            let started = Instant::now();
            let (config, live) = {
                let dense = dense.read().unwrap_or_else(|p| p.into_inner());
                (dense.config().clone(), dense.live_vectors())
            };
            let mut fresh = DenseIndex::new(config)
                .map_err(|e| LatheError::internal(format!("dense rebuild: {e}")))?;
            fresh
                .rebuild(live)
                .map_err(|e| LatheError::internal(format!("dense rebuild: {e}")))?;
            let replaced = std::mem::replace(
                &mut *dense.write().unwrap_or_else(|p| p.into_inner()),
                fresh,
            );
            // Freeing the old graph takes time too: not under the lock.
            drop(replaced);
            tracing::info!(
                seconds = started.elapsed().as_secs_f32(),
                "dense index compacted"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(doc_id: &str, text: &str) -> DocumentRecord {
        DocumentRecord {
            doc_id: doc_id.to_string(),
            title: doc_id.to_string(),
            metadata: BTreeMap::from([("lang".to_string(), "en".to_string())]),
            text_bytes: text.len() as u64,
            version: 1,
            sections: vec![SectionRecord {
                ordinal: 0,
                heading_path: vec!["Intro".to_string()],
                text: text.to_string(),
                byte_start: 0,
                char_start: 0,
                section_key: section_key(doc_id, 0, 1),
                // Two sentences: the first word, and the rest.
                sentences: vec![0..7, 8..text.len() as u32],
                sentence_vectors: Vec::new(),
                section_vector: Vec::new(),
            }],
        }
    }

    fn open(path: &Path) -> Result<CollectionIndex> {
        CollectionIndex::open_or_create(path, 15_000_000, Duration::from_secs(3600), None)
    }

    fn terms(index: &CollectionIndex, text: &str) -> Vec<String> {
        index.query_terms(text)
    }

    /// `collections/<name>/index` of a fresh data dir, holding two committed documents.
    fn written_collection(data_dir: &Path) -> PathBuf {
        let path = data_dir.join("collections/wiki/index");
        let index = open(&path).unwrap();
        let ops = vec![
            WriteOp::Upsert(record("a", "hazards in their line of sight")),
            WriteOp::Upsert(record("b", "boats in the harbour")),
        ];
        let done = index.write(ops, true).unwrap().unwrap();
        done.blocking_recv().unwrap().unwrap();
        index.shutdown();
        path
    }

    #[test]
    fn sections_read_back_exactly_and_verified() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open(&written_collection(data_dir.path())).unwrap();
        let snapshot = index.snapshot();
        let hits = index
            .search(&snapshot, &terms(&index, "hazards"), &Filter::default(), 8)
            .unwrap();
        assert_eq!(hits.len(), 1);
        let hit = &hits[0];
        assert_eq!(
            (
                hit.doc_id.as_str(),
                hit.text.as_str(),
                hit.heading_path.clone()
            ),
            (
                "a",
                "hazards in their line of sight",
                vec!["Intro".to_string()]
            )
        );
        assert_eq!(hit.metadata.get("lang").map(String::as_str), Some("en"));
        assert_eq!(hit.sentences, vec![0..7, 8..30]);
        assert_eq!(index.document_sections("b").unwrap(), vec![(0, 1)]);
        assert_eq!(index.damage(), None);
    }

    #[test]
    fn a_damaged_file_refuses_the_open_with_data_loss_naming_it() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = written_collection(data_dir.path());
        let postings = std::fs::read_dir(&path)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|file| file.extension().is_some_and(|e| e == "idx"))
            .unwrap();
        let mut damaged = std::fs::read(&postings).unwrap();
        damaged[0] ^= 0x20;
        std::fs::write(&postings, &damaged).unwrap();
        let file_name = postings.file_name().unwrap().to_string_lossy().into_owned();

        // Nothing of it is served (the catalog lists it damaged): a query would silently miss
        // the documents of the damaged segment.
        match open(&path).map(|_| ()) {
            Err(LatheError::DataLoss {
                collection,
                documents,
                detail,
            }) => {
                assert_eq!(collection, "wiki");
                assert!(documents.is_empty());
                assert!(
                    detail.starts_with(&format!("index file `{file_name}` fails its checksum")),
                    "{detail}"
                );
            }
            other => panic!("wanted DATA_LOSS, got {other:?}"),
        }
        // The damaged file stays as it was: nothing is repaired, removed or rewritten.
        assert_eq!(std::fs::read(&postings).unwrap(), damaged);
    }

    #[test]
    fn an_index_written_with_another_schema_is_refused_clearly() {
        let data_dir = tempfile::tempdir().unwrap();
        let path = data_dir.path().join("collections/old/index");
        std::fs::create_dir_all(&path).unwrap();
        // The schema before section checksums, reduced to one field: any other schema is refused.
        let mut builder = tantivy::schema::Schema::builder();
        builder.add_text_field("doc_id", tantivy::schema::STRING | tantivy::schema::STORED);
        drop(Index::create_in_dir(&path, builder.build()).unwrap());
        match open(&path) {
            Err(LatheError::IncompatibleIndex { collection, reason }) => {
                assert_eq!(collection, "old");
                assert!(reason.contains("earlier version of Lathe"), "{reason}");
                assert!(reason.contains("delete the collection"), "{reason}");
            }
            Err(other) => panic!("wanted IncompatibleIndex, got {other}"),
            Ok(_) => panic!("an index with another schema opened"),
        }
    }
}
