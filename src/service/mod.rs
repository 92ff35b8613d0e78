//! The service: what Lathe does, independent of gRPC. [`Engine`] validates requests against the
//! configured limits and runs the stages of the [`crate::ingest`] and [`crate::query`] pipelines in
//! order on the CPU pool; besides that it only keeps the caches and the metrics. The gRPC edge
//! calls the engine's methods directly: there is one implementation, so there is no trait.
//!
//! # Layout
//! - `mod.rs`: the engine: opening (model, catalog, pool), shutdown, what it keeps per collection.
//! - `collections.rs`: create, list, get and delete collections, and what they report.
//! - `aliases.rs`: create, switch, delete and list aliases; a call's name resolved, once.
//! - `write.rs`: upsert, delete and sync: into the write queue (or the log), and operations.
//! - `ingestor.rs`: the ingest stages, and the index workers that apply the write queue.
//! - `retrieve.rs`: runs the query stages, timing each under its stage's name; the result cache.
//! - `cache.rs`: the result and section caches.
//! - `metrics.rs`: collection gauges published at scrape time; stage and cache metrics per query.
//! - `snapshots.rs`: snapshots of collections and restores from them, off the async threads.
//! - `replica.rs`: with replication, the applier of log entries and the reads of the log.

mod aliases;
pub mod cache;
mod collections;
mod ingestor;
mod metrics;
mod replica;
mod retrieve;
mod scrub;
mod snapshots;
mod work;
mod write;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::chunk::{Strategy, Unit};
use crate::config::{Config, DenseModel};
use crate::cpu_pool::CpuPool;
use crate::embed::{Embedder, MiniLmConfig, MiniLmEmbedder, StaticEmbedder};
use crate::error::{LatheError, Result};
use crate::index::{
    Catalog, DataDirLock, DenseIndexConfig, Fault, OpenCollection, StoredSettings, WriterSettings,
    DENSE_SEARCH_WAIT_MAX_SECONDS, DENSE_SEARCH_WAIT_SECONDS,
};
/// A replica's progress through the write log (what its readiness follows).
pub use crate::replication::Progress as ReplicaProgress;
use crate::replication::{ApplyTask, Replication, VectorStamp};
/// An operator's recovery of a lost write log, and what it did.
pub use crate::replication::{Recovered, Recovery};
use crate::telemetry::Metrics;
use crate::tokenizer::BudgetTokenizer;
use crate::types::ChunkingSpec;
use crate::write_queue::{QueueLimits, WriteQueue};
use cache::Caches;
pub use snapshots::{Restored, SnapshotInfo};

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
    /// The ingest stages, the write queue and its index workers.
    ingestor: Arc<ingestor::Ingestor>,
    catalog: Arc<Catalog<CollectionRuntime>>,
    caches: Caches,
    pool: CpuPool,
    /// Collections whose per-collection series were published at the last scrape: a deleted
    /// collection's series are removed rather than left at their last value.
    published_collections: Mutex<BTreeSet<String>>,
    /// With replication: the link to the log (set once by [`Engine::start_replication`]) and
    /// the loop applying it.
    replication: OnceLock<Arc<Replication>>,
    apply_task: Mutex<Option<ApplyTask>>,
    /// With replication: this replica's index worker of queued writes (see `work`).
    work_task: Mutex<Option<work::WorkerTask>>,
    /// The scrub of every open collection's files, once started.
    scrub: Mutex<Option<scrub::ScrubTask>>,
}

impl Engine {
    pub fn open(config: Config, metrics: Arc<Metrics>) -> Result<Self> {
        // First, before models load or any collection opens: one server per data dir.
        let lock = DataDirLock::acquire(&config.storage.data_dir)?;
        metrics.register(Box::new(DENSE_SEARCH_WAIT_SECONDS.clone()));
        metrics.register(Box::new(DENSE_SEARCH_WAIT_MAX_SECONDS.clone()));
        let models_dir = config.models.dir.clone();
        let embedder = open_embedder(&config)?;
        let dense = embedder
            .as_ref()
            .map(|e| dense_index_config(&config.dense, e.dim()));
        let storage = &config.storage;
        let writer_settings = WriterSettings {
            memory_bytes: storage.writer_memory_bytes,
            indexing_threads: storage.indexing_threads,
            commit_interval: Duration::from_millis(storage.commit_interval_ms),
            idle_close: Duration::from_millis(storage.writer_idle_ms),
            threads: storage.writer_threads,
            max_open_writers: storage.max_open_writers,
            nice: config.ingest.worker_nice,
        };
        let catalog = Catalog::open(
            lock,
            &config.storage.data_dir,
            writer_settings,
            dense,
            storage.max_open_collections,
            move |_, stored| {
                runtime_for(stored, &models_dir)
                    .map_err(|error| tokenizer_fault(stored, &models_dir, &error))
            },
        )?;
        let catalog = Arc::new(catalog);
        let caches = Caches::new(
            config.cache.result_bytes,
            config.cache.section_bytes,
            config.cache.query_vector_bytes,
        );
        let pool = CpuPool::new(config.cpu_threads())?;
        // A single node acknowledges writes from its queue; a replica from the log.
        let queue = if config.replication.enabled() {
            None
        } else {
            let ingest = &config.ingest;
            let limits = QueueLimits {
                max_queued_bytes: ingest.max_queued_bytes,
                max_queued_bytes_total: ingest.max_queued_bytes_total,
                dedupe_window: Duration::from_secs(ingest.dedupe_window_s),
                retention: Duration::from_secs(ingest.operations_retention_s),
            };
            Some(Arc::new(WriteQueue::open(
                &config.storage.data_dir,
                limits,
            )?))
        };
        let ingestor = Arc::new(ingestor::Ingestor::new(
            config.clone(),
            embedder.clone(),
            ingest_inference_slots(&config),
            Arc::clone(&catalog),
            (
                pool.clone(),
                CpuPool::background(config.cpu_threads(), config.ingest.worker_nice)?,
            ),
            Arc::clone(&metrics),
            queue,
        ));
        Ok(Self {
            config,
            metrics,
            embedder,
            ingestor,
            catalog,
            caches,
            pool,
            published_collections: Mutex::new(BTreeSet::new()),
            replication: OnceLock::new(),
            apply_task: Mutex::new(None),
            work_task: Mutex::new(None),
            scrub: Mutex::new(None),
        })
    }

    /// On a single node: starts the index workers of the writes the queue holds (from before a
    /// restart) and the pruning of ended operations; and the scrub of every collection's files
    /// (see `scrub`). Call once, inside the runtime.
    pub fn start_writes(&self) {
        self.ingestor.start();
        *self.scrub.lock().unwrap_or_else(|p| p.into_inner()) = self.start_scrub();
    }

    /// With `replication.nats_url` set: connects to the log (in the background: reads are
    /// served meanwhile) and starts applying it. Without, does nothing.
    pub async fn start_replication(&self) -> Result<()> {
        let config = &self.config.replication;
        if !config.enabled() {
            return Ok(());
        }
        let replication = Replication::connect(
            config,
            &self.config.storage.data_dir,
            Duration::from_secs(self.config.ingest.dedupe_window_s),
        )
        .await?;
        replication.check_at_start(Duration::from_secs(5)).await?;
        let applier = replica::ReplicaApplier {
            catalog: Arc::clone(&self.catalog),
            models_dir: self.config.models.dir.clone(),
            vectors: self.vector_stamp(),
            metrics: Arc::clone(&self.metrics),
        };
        let task = replication.start(Arc::new(applier));
        *self.apply_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        *self.work_task.lock().unwrap_or_else(|p| p.into_inner()) =
            self.start_index_worker(&replication);
        let _ = self.replication.set(replication);
        tracing::info!(
            url = config.nats_url,
            stream = config.stream,
            "replica of the write log"
        );
        Ok(())
    }

    /// With replication: this replica's progress, to follow (readiness), and the lag past which
    /// it is not ready.
    pub fn replica_progress(
        &self,
    ) -> Option<(tokio::sync::watch::Receiver<ReplicaProgress>, Duration)> {
        let replication = self.replication.get()?;
        Some((replication.state().subscribe(), replication.max_lag()))
    }

    /// Stops applying the log, after the batch in hand is committed.
    pub async fn stop_replication(&self) {
        let worker = self
            .work_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(worker) = worker {
            worker.stop().await;
        }
        let task = self
            .apply_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            task.stop().await;
        }
    }

    /// The model that makes this server's vectors, as log entries name it.
    fn vector_stamp(&self) -> VectorStamp {
        match &self.embedder {
            Some(embedder) => VectorStamp {
                model: self.config.models.dense.name().into(),
                dim: embedder.dim() as u32,
            },
            None => VectorStamp {
                model: String::new(),
                dim: 0,
            },
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    /// Commits every collection; then waits until no CPU work runs any more. After the drain
    /// nobody waits for the pool's work: it is abandoned (inference stops at its next model run)
    /// so that the process never exits under a running ONNX Runtime kernel (see `cpu_pool`).
    pub fn shutdown(&self) {
        if let Some(scrub) = self.scrub.lock().unwrap_or_else(|p| p.into_inner()).take() {
            scrub.stop();
        }
        self.pool.stop();
        self.ingestor.background.stop();
        self.catalog.shutdown();
        let limit = Duration::from_secs(30);
        if !(self.pool.wait_idle(limit) && self.ingestor.background.wait_idle(limit)) {
            tracing::warn!(
                limit_s = limit.as_secs(),
                "CPU work still running at exit (a model run that does not end?)"
            );
        }
    }
}

/// How many writes may run their embed stage at once. With ONNX Runtime each run already uses
/// `models.inference_threads` cores, so two writes' runs side by side on the same cores only
/// contend (their threads spin against each other): one per `inference_threads` cores. A static
/// lookup is plain CPU work: one per core.
fn ingest_inference_slots(config: &Config) -> usize {
    let cores = config.cpu_threads();
    match config.models.dense {
        DenseModel::Minilm => (cores / config.models.inference_threads.max(1)).max(1),
        DenseModel::Static | DenseModel::Off => cores.max(1),
    }
}

/// Where, in the data dir, the MiniLM embedder writes its optimised model while it opens
/// ([`MiniLmConfig::optimized_model_dir`]); removed once the sessions have loaded it.
pub const OPTIMIZED_MODEL_DIR: &str = "minilm-optimized";

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
            minilm.max_batch_tokens = config.models.inference_batch_tokens;
            // A second session, so that query embeddings do not queue behind ingest batches.
            minilm.session_count = 2;
            // The session ingest takes first runs below the queries' priority.
            minilm.ingest_session_nice = config.ingest.worker_nice;
            // Under the data dir's lock: no other server writes here, and what a crash left
            // behind is emptied at the next open.
            minilm.optimized_model_dir = Some(config.storage.data_dir.join(OPTIMIZED_MODEL_DIR));
            Some(Arc::new(MiniLmEmbedder::new(minilm).map_err(hint)?))
        }
    })
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
            .and_then(Strategy::from_name),
        max_tokens: stored.default_max_tokens,
        overlap_tokens: stored.default_overlap_tokens,
        unit: Unit::Tokens,
        separators: Vec::new(),
        semantic: None,
    }
}

/// The dense index settings of a collection whose vectors have `dim` dimensions, from the
/// server's `[dense]` configuration.
pub fn dense_index_config(settings: &crate::config::DenseConfig, dim: usize) -> DenseIndexConfig {
    let mut dense = DenseIndexConfig::new(dim);
    dense.seal_vectors = settings.seal_vectors;
    dense.rebuild_dead_share = settings.rebuild_dead_share;
    dense.ef_search = settings.ef_search;
    dense.load_threads = settings.load_threads;
    dense.max_segment_vectors = settings.max_segment_vectors;
    dense.close_seal_min_vectors = settings.close_seal_min_vectors;
    dense
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_checks_the_cap_against_the_dense_index_own_merge_factor() {
        assert_eq!(
            crate::config::DENSE_TIER_MERGE_FACTOR,
            crate::index::DENSE_TIER_MERGE_FACTOR
        );
    }

    #[test]
    fn one_ingest_inference_per_inference_threads_cores_and_a_static_one_per_core() {
        let mut config = Config::default();
        config.server.cpu_threads = 2;
        assert_eq!(ingest_inference_slots(&config), 1);
        config.server.cpu_threads = 16;
        assert_eq!(ingest_inference_slots(&config), 8);
        config.models.inference_threads = 32;
        assert_eq!(ingest_inference_slots(&config), 1);
        config.models.dense = DenseModel::Static;
        assert_eq!(ingest_inference_slots(&config), 16);
    }
}
