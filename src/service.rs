//! The service layer: what Lathe does, independent of gRPC. `LatheApi` is the trait the gRPC edge
//! calls (tests can drive it without a network); `Engine` implements it by validating requests
//! against the configured limits and running the pipeline stages in order on the CPU pool.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cache::{Caches, ResultKey};
use crate::chunk::{ChunkOptions, Strategy, Unit};
use crate::config::{Config, LimitsConfig};
use crate::config::{DenseModel, FineModeName};
use crate::cpu_pool::CpuPool;
use crate::embed::{
    Embedder, FineMode, MiniLmConfig, MiniLmEmbedder, QuantizedVectors, StaticEmbedder,
    VectorMatrix,
};
use crate::error::{LatheError, Result};
use crate::index::{
    Catalog, CollectionEntry, DataDirLock, DocumentRecord, Fault, FaultKind, OpenCollection,
    SectionRecord, StoredSettings, WriteOp, WriterSettings,
};
use crate::pipeline::{analyze, coarse, pack, rechunk, score};
use crate::sections::{self, Format};
use crate::telemetry::Metrics;
use crate::tokenizer::BudgetTokenizer;
use crate::types::{
    ChunkingSpec, CollectionInfo, CollectionSettings, CollectionState, DocumentFormat,
    DocumentInput, ResultOrder, RetrieveQuery, RetrieveResult, RetrievedChunk, WriteOutcome,
};

#[tonic::async_trait]
pub trait LatheApi: Send + Sync + 'static {
    async fn create_collection(
        &self,
        name: String,
        settings: CollectionSettings,
    ) -> Result<CollectionInfo>;
    async fn list_collections(&self) -> Result<Vec<CollectionInfo>>;
    async fn get_collection(&self, name: &str) -> Result<CollectionInfo>;
    async fn delete_collection(&self, name: &str) -> Result<()>;
    async fn upsert_documents(
        &self,
        collection: &str,
        documents: Vec<DocumentInput>,
        wait: bool,
    ) -> Result<WriteOutcome>;
    async fn delete_documents(
        &self,
        collection: &str,
        ids: Vec<String>,
        wait: bool,
    ) -> Result<WriteOutcome>;
    /// Waits until everything written to `collection` so far is durable and visible.
    async fn sync(&self, collection: &str) -> Result<u64>;
    async fn retrieve(&self, query: RetrieveQuery) -> Result<RetrieveResult>;
}

/// What the service keeps beside each open collection's index.
pub struct CollectionRuntime {
    pub tokenizer: BudgetTokenizer,
    pub default_chunking: ChunkingSpec,
    /// Unique per opening in this process: a recreated collection never hits an old cache entry.
    pub incarnation: u64,
}

type Collection = OpenCollection<CollectionRuntime>;

static INCARNATIONS: AtomicU64 = AtomicU64::new(1);

pub struct Engine {
    config: Config,
    metrics: Arc<Metrics>,
    /// The model that makes sentence vectors at ingest and the query vector at query time.
    embedder: Option<Arc<dyn Embedder>>,
    catalog: Arc<Catalog<CollectionRuntime>>,
    caches: Caches,
    pool: CpuPool,
    /// Collections whose per-collection series were published at the last scrape: a deleted
    /// collection's series are removed rather than left at their last value.
    published_collections: Mutex<BTreeSet<String>>,
}

impl Engine {
    pub fn open(config: Config, metrics: Arc<Metrics>) -> Result<Self> {
        // First, before models load or any collection opens: one server per data dir.
        let lock = DataDirLock::acquire(&config.storage.data_dir)?;
        let models_dir = config.models.dir.clone();
        let embedder = open_embedder(&config)?;
        let dense_dim = embedder.as_ref().map(|e| e.dim());
        let storage = &config.storage;
        let writer_settings = WriterSettings {
            memory_bytes: storage.writer_memory_bytes,
            commit_interval: Duration::from_millis(storage.commit_interval_ms),
            idle_close: Duration::from_millis(storage.writer_idle_ms),
            threads: storage.writer_threads,
            max_open_writers: storage.max_open_writers,
        };
        let catalog = Catalog::open(
            lock,
            &config.storage.data_dir,
            writer_settings,
            dense_dim,
            |_, stored| {
                runtime_for(stored, &models_dir)
                    .map_err(|error| tokenizer_fault(stored, &models_dir, &error))
            },
        )?;
        let catalog = Arc::new(catalog);
        let caches = Caches::new(config.cache.result_bytes, config.cache.section_bytes);
        let pool = CpuPool::new(config.cpu_threads())?;
        Ok(Self {
            config,
            metrics,
            embedder,
            catalog,
            caches,
            pool,
            published_collections: Mutex::new(BTreeSet::new()),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    /// Publishes each collection's state and size and the writers' state to the metrics
    /// (called at scrape time).
    pub fn record_collection_metrics(&self) {
        let metrics = &self.metrics;
        metrics
            .index_writers_open
            .set(self.catalog.open_writers() as i64);
        let evictions = self.catalog.writer_evictions();
        let counted = metrics.index_writer_evictions.get();
        metrics
            .index_writer_evictions
            .inc_by(evictions.saturating_sub(counted));
        let infos: Vec<CollectionInfo> = self.catalog.entries().iter().map(Self::info).collect();
        let mut published = self
            .published_collections
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let current: BTreeSet<String> = infos.iter().map(|info| info.name.clone()).collect();
        for gone in published.difference(&current) {
            let name = [gone.as_str()];
            let _ = metrics.collection_documents.remove_label_values(&name);
            let _ = metrics.collection_sections.remove_label_values(&name);
            let _ = metrics.collection_bytes.remove_label_values(&name);
            let _ = metrics.collection_damaged.remove_label_values(&name);
        }
        *published = current;
        for state in [
            CollectionState::Ready,
            CollectionState::Damaged,
            CollectionState::Offline,
        ] {
            let count = infos.iter().filter(|info| info.state == state).count();
            metrics
                .collections
                .with_label_values(&[state.label()])
                .set(count as i64);
        }
        for info in &infos {
            let name = [info.name.as_str()];
            metrics
                .collection_damaged
                .with_label_values(&name)
                .set(i64::from(info.state != CollectionState::Ready));
            // A collection that is not open keeps its last sizes, if it had any.
            let Some(stats) = info.stats else {
                continue;
            };
            metrics
                .collection_documents
                .with_label_values(&name)
                .set(stats.documents as i64);
            metrics
                .collection_sections
                .with_label_values(&name)
                .set(stats.sections as i64);
            metrics
                .collection_bytes
                .with_label_values(&name)
                .set(stats.bytes as i64);
        }
    }

    /// Commits and closes every collection.
    /// Commits every collection; then waits until no CPU work runs any more. After the drain
    /// nobody waits for the pool's work: it is abandoned (inference stops at its next model run)
    /// so that the process never exits under a running ONNX Runtime kernel (see `cpu_pool`).
    pub fn shutdown(&self) {
        self.pool.stop();
        self.catalog.shutdown();
        let limit = Duration::from_secs(30);
        if !self.pool.wait_idle(limit) {
            tracing::warn!(
                limit_s = limit.as_secs(),
                "CPU work still running at exit (a model run that does not end?)"
            );
        }
    }

    /// What List/GetCollection report of one collection; never fails, so that one collection
    /// cannot hide the others.
    fn info(entry: &CollectionEntry<CollectionRuntime>) -> CollectionInfo {
        match entry {
            CollectionEntry::Ready(collection) => match collection.index.stats() {
                // Damage found while serving: what verifies is still served (see `damage`).
                Ok(stats) if collection.index.damage().is_some() => CollectionInfo {
                    name: collection.name.clone(),
                    state: CollectionState::Damaged,
                    reason: format!(
                        "{}; what verifies is still served, the rest answers DATA_LOSS",
                        collection.index.damage().unwrap_or_default()
                    ),
                    settings: Some(settings_from_stored(&collection.settings)),
                    stats: Some(stats),
                },
                Ok(stats) => CollectionInfo {
                    name: collection.name.clone(),
                    state: CollectionState::Ready,
                    reason: String::new(),
                    settings: Some(settings_from_stored(&collection.settings)),
                    stats: Some(stats),
                },
                Err(error) => CollectionInfo {
                    name: collection.name.clone(),
                    state: CollectionState::Damaged,
                    reason: format!(
                        "{}: reading its statistics failed: {error}",
                        collection.index.path().display()
                    ),
                    settings: Some(settings_from_stored(&collection.settings)),
                    stats: None,
                },
            },
            CollectionEntry::Faulted(faulted) => CollectionInfo {
                name: faulted.name.clone(),
                state: match faulted.fault.kind {
                    FaultKind::Damaged => CollectionState::Damaged,
                    FaultKind::Offline => CollectionState::Offline,
                },
                reason: faulted.fault.to_string(),
                settings: faulted.settings.as_ref().map(settings_from_stored),
                stats: None,
            },
        }
    }

    fn resolve_chunking(
        &self,
        requested: &ChunkingSpec,
        collection: &ChunkingSpec,
        token_budget: u32,
    ) -> Result<ChunkOptions> {
        let limits = &self.config.limits;
        let strategy = requested
            .strategy
            .or(collection.strategy)
            .unwrap_or(Strategy::Sentence);
        // Unless asked otherwise, no chunk is larger than the whole budget: a caller with a small
        // budget gets small chunks rather than none.
        let max_size = requested
            .max_tokens
            .or(collection.max_tokens)
            .unwrap_or_else(|| {
                self.config
                    .retrieval
                    .default_chunk_tokens
                    .min(token_budget.max(1))
            });
        let overlap = requested
            .overlap_tokens
            .or(collection.overlap_tokens)
            .unwrap_or(0);
        let unit = if requested.strategy.is_some() {
            requested.unit
        } else {
            collection.unit
        };
        check_chunk_sizes(max_size, overlap, limits.max_chunk_tokens)?;
        let separators = if requested.separators.is_empty() {
            None
        } else {
            Some(Arc::from(requested.separators.clone()))
        };
        Ok(ChunkOptions {
            strategy,
            max_size,
            overlap,
            unit,
            separators,
        })
    }

    /// Validates and sections one document (CPU work: runs on the pool).
    fn prepare_document(
        document: DocumentInput,
        section_tokens: usize,
        tokenizer: &BudgetTokenizer,
        max_sections: usize,
    ) -> Result<DocumentRecord> {
        let (text, spans) = match &document.sections {
            Some(boundaries) => {
                let boundaries: Vec<(u64, u64, String)> = boundaries
                    .iter()
                    .map(|b| (b.start, b.end, b.title.clone()))
                    .collect();
                let spans =
                    sections::caller_sections(&document.text, &boundaries).map_err(|error| {
                        LatheError::invalid(format!("documents[{}].sections", document.id), error)
                    })?;
                (document.text.clone(), spans)
            }
            None => {
                let format = match document.format {
                    DocumentFormat::Plain => Format::Plain,
                    DocumentFormat::Markdown => Format::Markdown,
                    DocumentFormat::Html => Format::Html,
                };
                let parsed =
                    sections::split_document(&document.text, format, section_tokens, tokenizer);
                (parsed.text.into_owned(), parsed.sections)
            }
        };
        if spans.len() > max_sections {
            return Err(LatheError::invalid(
                format!("documents[{}].text", document.id),
                format!(
                    "produces {} sections; the allowed range is 0..={max_sections}",
                    spans.len()
                ),
            ));
        }
        let version = document_version(&document);
        // Code-point offsets: one running count over the text, sections being in order.
        let mut sections = Vec::with_capacity(spans.len());
        let (mut counted_bytes, mut counted_chars) = (0usize, 0u64);
        for (ordinal, span) in spans.into_iter().enumerate() {
            if span.start < counted_bytes {
                counted_bytes = 0;
                counted_chars = 0;
            }
            counted_chars += text[counted_bytes..span.start].chars().count() as u64;
            counted_bytes = span.start;
            let section_text = text[span.start..span.end].to_string();
            let mut sentences = Vec::new();
            crate::chunk::sentences(&section_text, &mut sentences);
            sections.push(SectionRecord {
                ordinal: ordinal as u64,
                heading_path: span.heading_path,
                text: section_text,
                byte_start: span.start as u64,
                char_start: counted_chars,
                section_key: crate::index::collection::section_key(
                    &document.id,
                    ordinal as u64,
                    version,
                ),
                sentences,
                sentence_vectors: Vec::new(),
                section_vector: Vec::new(),
            });
        }
        Ok(DocumentRecord {
            doc_id: document.id,
            title: document.title,
            metadata: document.metadata,
            text_bytes: text.len() as u64,
            version,
            sections,
        })
    }
}

/// Sentence vectors of every section of `records` (batched across sections), stored as int8, and
/// each section's vector: the mean of its sentence vectors weighted by their length.
fn embed_sections(
    embedder: &dyn Embedder,
    mode: FineMode,
    records: &mut [DocumentRecord],
) -> Result<()> {
    let ranges: Vec<Vec<std::ops::Range<usize>>> = records
        .iter()
        .flat_map(|record| &record.sections)
        .map(|section| {
            section
                .sentences
                .iter()
                .map(|r| r.start as usize..r.end as usize)
                .collect()
        })
        .collect();
    let inputs: Vec<(&str, &[std::ops::Range<usize>])> = records
        .iter()
        .flat_map(|record| &record.sections)
        .zip(&ranges)
        .map(|(section, ranges)| (section.text.as_str(), ranges.as_slice()))
        .collect();
    let matrices = embedder
        .sentence_vectors_of_sections(&inputs, mode)
        .map_err(|e| LatheError::Unavailable(format!("embedding failed: {e}")))?;
    drop(inputs);
    let sections = records
        .iter_mut()
        .flat_map(|record| record.sections.iter_mut());
    for (section, matrix) in sections.zip(matrices) {
        if matrix.is_empty() {
            continue;
        }
        let quantized = QuantizedVectors::from_matrix(&matrix);
        let weights: Vec<f32> = section
            .sentences
            .iter()
            .map(|r| (r.end - r.start) as f32)
            .collect();
        let Ok(pooled) = quantized.pool(0..quantized.len(), &weights) else {
            continue;
        };
        let Some(section_vector) = VectorMatrix::from_values(pooled.len(), pooled) else {
            continue;
        };
        section.sentence_vectors = quantized.to_bytes();
        section.section_vector = QuantizedVectors::from_matrix(&section_vector).to_bytes();
    }
    Ok(())
}

fn open_embedder(config: &Config) -> Result<Option<Arc<dyn Embedder>>> {
    let dir = &config.models.dir;
    let hint = |error: crate::embed::EmbedError| {
        LatheError::invalid(
            "models.dense",
            format!(
                "{error}; run `scripts/fetch-models.sh {}` to fetch the models, or set models.dense = \"off\" to run lexical-only",
                dir.display()
            ),
        )
    };
    Ok(match config.models.dense {
        DenseModel::Off => None,
        DenseModel::Static => Some(Arc::new(
            StaticEmbedder::from_models_dir(dir).map_err(hint)?,
        )),
        DenseModel::Minilm => {
            let mut minilm = MiniLmConfig::from_models_dir(dir);
            minilm.intra_op_threads = config.models.inference_threads;
            minilm.memory_arena = config.models.inference_memory_arena;
            // A second session, so that query embeddings do not queue behind ingest batches.
            minilm.session_count = 2;
            Some(Arc::new(MiniLmEmbedder::new(minilm).map_err(hint)?))
        }
    })
}

fn check_chunk_sizes(max_size: u32, overlap: u32, max_chunk_tokens: u32) -> Result<()> {
    if !(1..=max_chunk_tokens).contains(&max_size) {
        return Err(LatheError::invalid(
            "chunking.max_tokens",
            format!("is {max_size}; the allowed range is 1..={max_chunk_tokens}"),
        ));
    }
    if overlap >= max_size {
        return Err(LatheError::invalid(
            "chunking.overlap_tokens",
            format!(
                "is {overlap}; it must be below chunking.max_tokens ({max_size}), i.e. in 0..={}",
                max_size - 1
            ),
        ));
    }
    Ok(())
}

fn document_version(document: &DocumentInput) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(document.title.as_bytes());
    hasher.update(&[0]);
    hasher.update(document.text.as_bytes());
    for (key, value) in &document.metadata {
        hasher.update(&[0]);
        hasher.update(key.as_bytes());
        hasher.update(&[0]);
        hasher.update(value.as_bytes());
    }
    let bytes = hasher.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().unwrap_or_default())
}

fn runtime_for(stored: &StoredSettings, models_dir: &std::path::Path) -> Result<CollectionRuntime> {
    let tokenizer = BudgetTokenizer::resolve(&stored.budget_tokenizer, models_dir)?;
    Ok(CollectionRuntime {
        tokenizer,
        default_chunking: chunking_from_stored(stored),
        incarnation: INCARNATIONS.fetch_add(1, Ordering::Relaxed),
    })
}

/// Why a stored collection's tokenizer cannot be loaded: a collection made with a tokenizer file
/// that has since gone stays offline (its data intact) instead of stopping the server.
fn tokenizer_fault(
    stored: &StoredSettings,
    models_dir: &std::path::Path,
    error: &LatheError,
) -> Fault {
    let reason = match error {
        LatheError::InvalidArgument { reason, .. } => reason.clone(),
        other => other.to_string(),
    };
    let file = match stored.budget_tokenizer.as_str() {
        "" | crate::tokenizer::DEFAULT_TOKENIZER => {
            Some(models_dir.join(crate::tokenizer::MINILM_TOKENIZER_PATH))
        }
        path if path.ends_with(".json") => Some(std::path::PathBuf::from(path)),
        _ => None,
    };
    match file {
        Some(path) if !path.exists() => Fault::offline(
            path,
            "the collection's tokenizer file (settings.budget_tokenizer) is missing",
        ),
        Some(path) => Fault::offline(path, reason),
        None => Fault::offline(&stored.budget_tokenizer, reason),
    }
}

fn chunking_from_stored(stored: &StoredSettings) -> ChunkingSpec {
    ChunkingSpec {
        strategy: stored
            .default_strategy
            .as_deref()
            .and_then(strategy_from_name),
        max_tokens: stored.default_max_tokens,
        overlap_tokens: stored.default_overlap_tokens,
        unit: Unit::Tokens,
        separators: Vec::new(),
        semantic: None,
    }
}

pub fn strategy_name(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Fixed => "fixed",
        Strategy::Sentence => "sentence",
        Strategy::Recursive => "recursive",
        Strategy::Structure => "structure",
        Strategy::Auto => "auto",
        Strategy::Semantic => "semantic",
        Strategy::Csv => "csv",
        Strategy::Code => "code",
    }
}

pub fn strategy_from_name(name: &str) -> Option<Strategy> {
    Some(match name {
        "fixed" => Strategy::Fixed,
        "sentence" => Strategy::Sentence,
        "recursive" => Strategy::Recursive,
        "structure" => Strategy::Structure,
        "auto" => Strategy::Auto,
        "semantic" => Strategy::Semantic,
        "csv" => Strategy::Csv,
        "code" => Strategy::Code,
        _ => return None,
    })
}

fn settings_from_stored(stored: &StoredSettings) -> CollectionSettings {
    CollectionSettings {
        budget_tokenizer: stored.budget_tokenizer.clone(),
        default_chunking: chunking_from_stored(stored),
        section_tokens: stored.section_tokens,
    }
}

/// The query's own limits (text length, top_k, budget), checked before any work is done.
pub fn validate_query(limits: &LimitsConfig, query: &RetrieveQuery) -> Result<()> {
    if query.query.is_empty() {
        return Err(LatheError::invalid(
            "query",
            "must contain at least one non-whitespace character",
        ));
    }
    if query.query.len() > limits.max_query_bytes {
        return Err(LatheError::invalid(
            "query",
            format!(
                "is {} bytes; the allowed range is 1..={} bytes",
                query.query.len(),
                limits.max_query_bytes
            ),
        ));
    }
    if !(1..=limits.max_top_k).contains(&query.top_k) {
        return Err(LatheError::invalid(
            "top_k",
            format!(
                "is {}; the allowed range is 1..={}",
                query.top_k, limits.max_top_k
            ),
        ));
    }
    if !(1..=limits.max_token_budget).contains(&query.token_budget) {
        return Err(LatheError::invalid(
            "token_budget",
            format!(
                "is {}; the allowed range is 1..={}",
                query.token_budget, limits.max_token_budget
            ),
        ));
    }
    Ok(())
}

fn validate_collection_name(name: &str) -> Result<()> {
    if crate::index::is_valid_collection_name(name) {
        Ok(())
    } else {
        Err(LatheError::invalid(
            "name",
            format!(
                "`{}` must be 1 to 64 characters of [A-Za-z0-9_-]",
                name.chars().take(80).collect::<String>()
            ),
        ))
    }
}

#[tonic::async_trait]
impl LatheApi for Engine {
    async fn create_collection(
        &self,
        name: String,
        settings: CollectionSettings,
    ) -> Result<CollectionInfo> {
        validate_collection_name(&name)?;
        if settings.section_tokens == 0
            || settings.section_tokens > self.config.limits.max_chunk_tokens.max(65_536)
        {
            return Err(LatheError::invalid(
                "settings.section_tokens",
                format!(
                    "is {}; the allowed range is 1..=65536",
                    settings.section_tokens
                ),
            ));
        }
        let chunking = &settings.default_chunking;
        if chunking.max_tokens.is_some() || chunking.overlap_tokens.is_some() {
            let max_size = chunking
                .max_tokens
                .unwrap_or(self.config.retrieval.default_chunk_tokens);
            check_chunk_sizes(
                max_size,
                chunking.overlap_tokens.unwrap_or(0),
                self.config.limits.max_chunk_tokens,
            )
            .map_err(|e| match e {
                LatheError::InvalidArgument { field, reason } => {
                    LatheError::invalid(format!("settings.default_{field}"), reason)
                }
                other => other,
            })?;
        }
        let stored = StoredSettings {
            budget_tokenizer: if settings.budget_tokenizer.is_empty() {
                crate::tokenizer::DEFAULT_TOKENIZER.to_string()
            } else {
                settings.budget_tokenizer.clone()
            },
            section_tokens: settings.section_tokens,
            default_strategy: chunking.strategy.map(|s| strategy_name(s).to_string()),
            default_max_tokens: chunking.max_tokens,
            default_overlap_tokens: chunking.overlap_tokens,
        };
        let runtime = runtime_for(&stored, &self.config.models.dir)?;
        let catalog = Arc::clone(&self.catalog);
        let collection = blocking(move || catalog.create(&name, stored, runtime)).await?;
        Ok(Self::info(&CollectionEntry::Ready(collection)))
    }

    async fn list_collections(&self) -> Result<Vec<CollectionInfo>> {
        Ok(self.catalog.entries().iter().map(Self::info).collect())
    }

    async fn get_collection(&self, name: &str) -> Result<CollectionInfo> {
        Ok(Self::info(&self.catalog.entry(name)?))
    }

    async fn delete_collection(&self, name: &str) -> Result<()> {
        let catalog = Arc::clone(&self.catalog);
        let name = name.to_string();
        blocking(move || catalog.delete(&name)).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(collection = %collection_name, documents = documents.len(), wait))]
    async fn upsert_documents(
        &self,
        collection_name: &str,
        documents: Vec<DocumentInput>,
        wait: bool,
    ) -> Result<WriteOutcome> {
        let collection = self.catalog.get(collection_name).map_err(|error| {
            let ids: Vec<String> = documents.iter().map(|d| d.id.clone()).collect();
            error.naming_documents(&ids)
        })?;
        let limits = &self.config.limits;
        if documents.len() > limits.max_batch_documents {
            return Err(LatheError::invalid(
                "documents",
                format!(
                    "holds {} documents; the allowed range is 0..={}",
                    documents.len(),
                    limits.max_batch_documents
                ),
            ));
        }
        let mut seen = HashSet::with_capacity(documents.len());
        for (i, document) in documents.iter().enumerate() {
            if document.id.is_empty() {
                return Err(LatheError::invalid(
                    format!("documents[{i}].id"),
                    "must not be empty",
                ));
            }
            if !seen.insert(document.id.as_str()) {
                return Err(LatheError::invalid(
                    format!("documents[{i}].id"),
                    format!(
                        "`{}` appears more than once in the batch; each id may appear once",
                        document.id
                    ),
                ));
            }
            if document.text.len() > limits.max_document_bytes {
                return Err(LatheError::TooLarge {
                    what: format!("documents[{i}].text"),
                    size: document.text.len() as u64,
                    limit: limits.max_document_bytes as u64,
                });
            }
            if document.format == DocumentFormat::Html && document.sections.is_none() {
                let depth = sections::html_nesting_depth(&document.text);
                if depth > limits.max_html_depth {
                    return Err(LatheError::invalid(
                        format!("documents[{i}].text"),
                        format!(
                            "HTML nests {depth} elements deep; the allowed range is 0..={}",
                            limits.max_html_depth
                        ),
                    ));
                }
            }
        }
        let section_tokens = collection.settings.section_tokens as usize;
        let max_sections = limits.max_sections_per_document;
        let prepared_collection = Arc::clone(&collection);
        let records = self
            .pool
            .run(move || {
                documents
                    .into_iter()
                    .map(|document| {
                        Engine::prepare_document(
                            document,
                            section_tokens,
                            &prepared_collection.extra.tokenizer,
                            max_sections,
                        )
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .await?;
        let records = match &self.embedder {
            None => records,
            Some(embedder) => {
                let embedder = Arc::clone(embedder);
                let mode = match self.config.models.fine_mode {
                    FineModeName::Late => FineMode::LateChunking,
                    FineModeName::Sentence => FineMode::PerSentence,
                };
                let metrics = Arc::clone(&self.metrics);
                let model = match self.config.models.dense {
                    DenseModel::Static => "static",
                    _ => "minilm",
                };
                self.pool
                    .run(move || {
                        let mut records = records;
                        let started = Instant::now();
                        embed_sections(embedder.as_ref(), mode, &mut records)?;
                        metrics.embedding_batches.with_label_values(&[model]).inc();
                        metrics
                            .embedding_batch_seconds
                            .with_label_values(&[model])
                            .observe(started.elapsed().as_secs_f64());
                        Ok(records)
                    })
                    .await?
            }
        };
        let outcome = WriteOutcome {
            documents: records.len() as u32,
            sections: records.iter().map(|r| r.sections.len() as u32).sum(),
            generation: 0,
        };
        let ops = records.into_iter().map(WriteOp::Upsert).collect();
        let generation = await_write(collection.index.write(ops, wait)?).await?;
        Ok(WriteOutcome {
            generation,
            ..outcome
        })
    }

    async fn delete_documents(
        &self,
        collection_name: &str,
        ids: Vec<String>,
        wait: bool,
    ) -> Result<WriteOutcome> {
        let collection = self
            .catalog
            .get(collection_name)
            .map_err(|error| error.naming_documents(&ids))?;
        if let Some(i) = ids.iter().position(String::is_empty) {
            return Err(LatheError::invalid(
                format!("ids[{i}]"),
                "must not be empty",
            ));
        }
        let documents = ids.len() as u32;
        let ops = ids
            .into_iter()
            .map(|doc_id| WriteOp::Delete { doc_id })
            .collect();
        let generation = await_write(collection.index.write(ops, wait)?).await?;
        Ok(WriteOutcome {
            documents,
            sections: 0,
            generation,
        })
    }

    async fn sync(&self, collection_name: &str) -> Result<u64> {
        let collection = self.catalog.get(collection_name)?;
        await_write(collection.index.write(Vec::new(), true)?).await
    }

    async fn retrieve(&self, query: RetrieveQuery) -> Result<RetrieveResult> {
        let started = Instant::now();
        validate_query(&self.config.limits, &query)?;
        let collection = self
            .catalog
            .get(&query.collection)
            .map_err(|error| error.naming_documents(&query.filter.doc_ids))?;
        let options = self.resolve_chunking(
            &query.chunking,
            &collection.extra.default_chunking,
            query.token_budget,
        )?;
        // Read before the snapshot: see `CollectionIndex::commit_seqlock`.
        let changes_at_start = collection.index.commit_seqlock();
        let snapshot = collection.index.snapshot();
        let key = ResultKey {
            incarnation: collection.extra.incarnation,
            generation: snapshot.generation,
            query,
        };
        if let Some(cached) = self.caches.results.get(&key) {
            self.metrics
                .cache_lookups
                .with_label_values(&["result", "hit"])
                .inc();
            let mut result = (*cached).clone();
            result.cache_hit = true;
            result.timings = vec![
                ("cache", started.elapsed().as_micros() as u64),
                ("total", started.elapsed().as_micros() as u64),
            ];
            return Ok(result);
        }
        self.metrics
            .cache_lookups
            .with_label_values(&["result", "miss"])
            .inc();
        let caches = self.caches.clone();
        let retrieval = &self.config.retrieval;
        let settings = PipelineSettings {
            weights: score::Weights {
                bm25: retrieval.bm25_weight,
                section: retrieval.section_weight,
                dense: retrieval.dense_weight,
            },
            fusion: coarse::Fusion {
                k: retrieval.rrf_k,
                lexical_weight: retrieval.rrf_lexical_weight,
                dense_weight: retrieval.rrf_dense_weight,
            },
            embedder: self.embedder.clone(),
        };
        let pipeline_key = key.clone();
        let pipeline_collection = Arc::clone(&collection);
        let mut result = self
            .pool
            .run(move || {
                run_pipeline(
                    &pipeline_collection,
                    &snapshot,
                    &pipeline_key.query,
                    &options,
                    &settings,
                    &caches,
                )
            })
            .await?;
        result.generation = key.generation;
        result
            .timings
            .push(("total", started.elapsed().as_micros() as u64));
        for &(stage, micros) in &result.timings {
            self.metrics
                .stage_seconds
                .with_label_values(&[stage])
                .observe(micros as f64 / 1e6);
        }
        let section_misses = result.section_cache_misses as u64;
        let section_hits = u64::from(result.sections_considered).saturating_sub(section_misses);
        self.metrics
            .cache_lookups
            .with_label_values(&["section", "hit"])
            .inc_by(section_hits);
        self.metrics
            .cache_lookups
            .with_label_values(&["section", "miss"])
            .inc_by(section_misses);
        // An answer computed while a commit was changing the dense index may differ from one
        // computed at its generation later: it is returned, but not cached.
        let one_state =
            changes_at_start % 2 == 0 && collection.index.commit_seqlock() == changes_at_start;
        if one_state {
            self.caches.results.insert(key, Arc::new(result.clone()));
        }
        Ok(result)
    }
}

/// Runs blocking file-system work (fsyncs, renames) off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LatheError::internal(format!("blocking task failed: {e}")))?
}

async fn await_write(receiver: Option<tokio::sync::oneshot::Receiver<Result<u64>>>) -> Result<u64> {
    match receiver {
        None => Ok(0),
        Some(receiver) => receiver.await.map_err(|_| {
            LatheError::Unavailable("the collection's writer stopped before committing".into())
        })?,
    }
}

/// Fixed for the life of the engine: how signals are weighed, and the query embedder.
struct PipelineSettings {
    weights: score::Weights,
    fusion: coarse::Fusion,
    embedder: Option<Arc<dyn Embedder>>,
}

/// Runs the stages in order (see `pipeline`), timing each.
fn run_pipeline(
    collection: &Collection,
    snapshot: &crate::index::Snapshot,
    query: &RetrieveQuery,
    options: &ChunkOptions,
    settings: &PipelineSettings,
    caches: &Caches,
) -> Result<RetrieveResult> {
    let mut timings = Vec::with_capacity(6);
    let mut clock = Instant::now();
    let mut lap = |stage: &'static str, timings: &mut Vec<(&'static str, u64)>| {
        timings.push((stage, clock.elapsed().as_micros() as u64));
        clock = Instant::now();
    };
    let index = &collection.index;
    let tokenizer = &collection.extra.tokenizer;

    // The only model pass at query time: the query itself.
    let query_vector =
        match (&settings.embedder, index.has_dense()) {
            (Some(embedder), true) => Some(embedder.embed_query(&query.query).map_err(|e| {
                LatheError::Unavailable(format!("embedding the query failed: {e}"))
            })?),
            _ => None,
        };
    lap("embed", &mut timings);

    let terms = index.query_terms(&query.query);
    let hits = coarse::retrieve(
        index,
        snapshot,
        &terms,
        query_vector.as_deref(),
        &query.filter,
        query.top_k as usize,
        settings.fusion,
    )?;
    let query_terms = score::QueryTerms {
        hashes: terms.iter().map(|t| analyze::term_hash(t)).collect(),
        idf: index.idf(snapshot, &terms)?,
    };
    lap("retrieve", &mut timings);

    let (analyses, section_cache_misses) = analyze::analyze(
        hits.iter().map(|hit| hit.text.as_str()),
        tokenizer,
        &caches.sections,
    );
    lap("analyze", &mut timings);

    let semantic_threshold = query
        .chunking
        .semantic
        .map(|rule| rule.threshold())
        .unwrap_or_default();
    let mut candidates = rechunk::rechunk(&hits, &analyses, options, semantic_threshold);
    lap("chunk", &mut timings);

    score::score(
        &mut candidates,
        &hits,
        &analyses,
        &query_terms,
        query_vector.as_deref(),
        settings.weights,
    );
    lap("score", &mut timings);

    let mut spans = pack::pack(&candidates, &hits, &analyses, query.token_budget, tokenizer);
    if query.order == ResultOrder::Position {
        order_by_position(&mut spans, &hits);
    }
    lap("pack", &mut timings);

    let chunks = assemble(&spans, &hits);
    Ok(RetrieveResult {
        tokens_used: spans.iter().map(|s| s.token_count).sum(),
        token_budget: query.token_budget,
        generation: snapshot.generation,
        cache_hit: false,
        timings,
        sections_considered: hits.len() as u32,
        section_cache_misses,
        chunks_considered: candidates.len() as u32,
        chunks,
    })
}

/// Documents in the order of their best span; spans of one document in document order.
fn order_by_position(spans: &mut [pack::PackedSpan], hits: &[crate::index::SectionHit]) {
    let mut document_rank: Vec<(&str, usize)> = Vec::new();
    for span in spans.iter() {
        let doc_id = hits[span.section as usize].doc_id.as_str();
        if !document_rank.iter().any(|(id, _)| *id == doc_id) {
            document_rank.push((doc_id, document_rank.len()));
        }
    }
    let rank_of = |doc_id: &str| {
        document_rank
            .iter()
            .find(|(id, _)| *id == doc_id)
            .map_or(usize::MAX, |(_, r)| *r)
    };
    spans.sort_by_key(|span| {
        let hit = &hits[span.section as usize];
        (rank_of(&hit.doc_id), hit.byte_start + span.start as u64)
    });
}

fn assemble(spans: &[pack::PackedSpan], hits: &[crate::index::SectionHit]) -> Vec<RetrievedChunk> {
    spans
        .iter()
        .map(|span| {
            let hit = &hits[span.section as usize];
            let (start, end) = (span.start as usize, span.end as usize);
            let text = &hit.text[start..end];
            let chars_before = hit.text[..start].chars().count() as u64;
            let char_start = hit.char_start + chars_before;
            RetrievedChunk {
                doc_id: hit.doc_id.clone(),
                section_ordinal: hit.ordinal,
                heading_path: hit.heading_path.clone(),
                doc_title: hit.doc_title.clone(),
                text: text.to_string(),
                context: span.header.map_or_else(String::new, |(a, b)| {
                    hit.text[a as usize..b as usize].to_string()
                }),
                bytes: hit.byte_start + start as u64..hit.byte_start + end as u64,
                chars: char_start..char_start + text.chars().count() as u64,
                token_count: span.token_count,
                score: span.score,
                parts: span.parts,
                strategy: span.strategy,
                metadata: hit.metadata.clone(),
            }
        })
        .collect()
}
