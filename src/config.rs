//! Server configuration: built-in defaults, then a TOML file, then `LATHE_`-prefixed environment
//! variables (`LATHE_SERVER__LISTEN=0.0.0.0:50051`, sections split by `__`), then command-line
//! flags. Unknown keys are rejected with the key's name. `deploy/lathe.toml` documents every key
//! and holds exactly the built-in defaults (a unit test keeps the two equal).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// The documented default configuration, embedded in the binary.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../deploy/lathe.toml");

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub models: ModelsConfig,
    pub dense: DenseConfig,
    pub limits: LimitsConfig,
    pub retrieval: RetrievalConfig,
    pub cache: CacheConfig,
    pub log: LogConfig,
    pub tls: TlsConfig,
    pub auth: AuthConfig,
    pub replication: ReplicationConfig,
}

/// Replicas fed by a replicated write log on NATS JetStream (see `crate::replication`). Off (a
/// single node, everything local) while `nats_url` is empty.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    /// NATS server URL(s), comma-separated (`nats://nats-0.nats:4222,nats://nats-1.nats:4222`);
    /// empty = single node.
    pub nats_url: String,
    /// The JetStream stream holding the log; its subjects are `<stream, lowercased>.log.>` and
    /// `.part.>`. Every replica of one deployment names the same stream.
    pub stream: String,
    /// Copies of the stream that the NATS cluster keeps (JetStream's replicas: 1, 3 or 5).
    pub stream_replicas: usize,
    /// How long a write waits for JetStream to acknowledge it (milliseconds).
    pub publish_timeout_ms: u64,
    /// A replica whose newest applied entry was published more than this long ago while newer
    /// entries wait reports NOT_SERVING until it has caught up again (seconds; 0 = never).
    pub max_lag_seconds: u64,
    /// Largest message published, in bytes; a document version larger than this is split into
    /// parts. 0 = the NATS server's `max_payload`.
    pub max_message_bytes: usize,
    /// Log entries applied together: one commit per collection per batch.
    pub apply_batch: usize,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            nats_url: String::new(),
            stream: "LATHE".to_string(),
            stream_replicas: 1,
            publish_timeout_ms: 5_000,
            max_lag_seconds: 60,
            max_message_bytes: 0,
            apply_batch: 512,
        }
    }
}

impl ReplicationConfig {
    pub fn enabled(&self) -> bool {
        !self.nats_url.trim().is_empty()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain; TLS is on when this and `key_file` are set.
    pub cert_file: String,
    /// PEM private key.
    pub key_file: String,
    /// PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS).
    pub client_ca_file: String,
}

impl TlsConfig {
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty() || !self.key_file.is_empty()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// File of API keys, one `<scope> <key>` a line (`read-only` or `read-write`); empty = no
    /// authentication. Clients send `authorization: Bearer <key>`; health and reflection stay open.
    pub api_keys_file: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// HTTP address of the Prometheus `/metrics` endpoint; empty = off.
    pub metrics_listen: String,
    /// Plaintext address serving only `grpc.health.v1.Health` (for probes that cannot speak
    /// TLS, like the kubelet's); empty = off.
    pub health_listen: String,
    /// Threads of the bounded CPU pool for search, chunking and inference (0 = one per core).
    pub cpu_threads: usize,
    /// Requests served at once; more are shed with RESOURCE_EXHAUSTED.
    pub max_concurrent_requests: usize,
    /// Deadline for one request when the client sets none (milliseconds).
    pub request_timeout_ms: u64,
    /// Time given to in-flight requests after SIGTERM (milliseconds).
    pub drain_timeout_ms: u64,
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
    /// that of hnsw_rs's plain search (see `dense::search_segment`).
    pub ef_search: usize,
    /// Sealed segments a collection's open loads at once (0: one per core). Side by side, a
    /// million sections open in 9–13 s instead of 14–16 s, and hold about 350 MiB more (the
    /// loads' interleaved allocations); 1 loads them one at a time.
    pub load_threads: usize,
    /// Vectors a background merge may build one sealed segment of (0: no limit). A lower limit
    /// keeps more, smaller graphs: higher recall against exact search, slower searches.
    pub max_segment_vectors: usize,
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
        }
    }
}

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
    /// Threads that apply writes and commit, shared by every collection.
    pub writer_threads: usize,
    /// Tantivy writers open at once (each holds `indexing_threads` + 2 threads, a file lock and
    /// up to `writer_memory_bytes`); past it, the least recently used idle writer is committed
    /// and closed to make room.
    pub max_open_writers: usize,
    /// A collection's writer is closed after this long without writes (milliseconds).
    pub writer_idle_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Folder laid out by `scripts/fetch-models.sh`.
    pub dir: PathBuf,
    /// Dense embeddings: `minilm` (all-MiniLM-L6-v2 over ONNX Runtime), `static` (wordllama
    /// static vectors) or `off` (lexical only).
    pub dense: DenseModel,
    /// How sentence vectors are made at ingest: `late` (late chunking: the section is run through
    /// the model in windows and each sentence's token states are pooled) or `sentence` (each
    /// sentence embedded on its own).
    pub fine_mode: FineModeName,
    /// Threads ONNX Runtime uses inside one operator.
    pub inference_threads: usize,
    /// ONNX Runtime's CPU memory arena and memory patterns. On, a session reuses its arena across
    /// the runs of one write and hands the free part back after the write's last run (a peak of
    /// about 0.35 GiB above the idle server with 2,048-token batches); off, activations are
    /// allocated per run, which makes inference about twice as slow (the pages are faulted in
    /// again every run).
    pub inference_memory_arena: bool,
    /// Most padded tokens (sequences × the longest) in one model run at ingest, 256..=65536.
    /// Larger batches hold more activation memory per run without running faster on a CPU.
    pub inference_batch_tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseModel {
    Minilm,
    Static,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FineModeName {
    Late,
    Sentence,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    pub max_top_k: u32,
    pub max_token_budget: u32,
    /// Largest document text, in bytes.
    pub max_document_bytes: usize,
    /// Largest query text, in bytes.
    pub max_query_bytes: usize,
    /// Largest chunk size a request may ask for, in tokens.
    pub max_chunk_tokens: u32,
    /// Most documents in one upsert batch.
    pub max_batch_documents: usize,
    /// Most sections one document may produce.
    pub max_sections_per_document: usize,
    /// Deepest element nesting of an HTML document (parsing costs time quadratic in the depth).
    pub max_html_depth: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrievalConfig {
    /// The least sections retrieved when a request gives no top_k (the budget may ask for more).
    pub default_top_k: u32,
    /// Chunk size from budgets of 2,048 on when neither request nor collection gives one, in tokens.
    pub default_chunk_tokens: u32,
    /// Weight of the section's (normalised) score in a chunk's score.
    pub section_weight: f32,
    /// Weight of the chunk's own normalised BM25.
    pub bm25_weight: f32,
    /// Weight of the chunk's pooled dense similarity to the query (normalised over candidates).
    pub dense_weight: f32,
    /// Reciprocal rank fusion of the section legs: `weight / (rrf_k + rank)`.
    pub rrf_k: f32,
    pub rrf_lexical_weight: f32,
    pub rrf_dense_weight: f32,
    /// MMR trade-off applied to a request that leaves `diversity` unset when its query is
    /// ambiguous (see `ambiguous_gap`); 0: never.
    pub ambiguous_diversity: f32,
    /// A query is ambiguous when the best chunk of its fifth-best document scores within this
    /// share of the chunk score's range (the sum of the weights in use) of its best chunk.
    pub ambiguous_gap: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Result cache: whole answers keyed by request and index generation (bytes).
    pub result_bytes: u64,
    /// Section cache: token offsets and term positions keyed by content hash (bytes). It spares
    /// a query the analysis of sections that earlier queries analysed: 64 MiB holds those of
    /// about ten thousand 256-token sections; at a million sections, four times that saved
    /// 0.1–0.3 ms a query for about 180 MiB (docs/notebook/benchmarks-notebook.md, "Smaller caches").
    pub section_bytes: u64,
    /// Query-vector cache: query vectors keyed by model and normalised query text (bytes).
    pub query_vector_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// An `EnvFilter` directive, e.g. `info` or `lathe=debug,tantivy=warn`.
    pub filter: String,
    /// OTLP/gRPC endpoint that tracing spans are exported to (e.g. `http://otel-collector:4317`);
    /// empty = off. Needs a build with the `otel` feature.
    pub otlp_endpoint: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: String::new(),
            health_listen: String::new(),
            cpu_threads: 0,
            max_concurrent_requests: 256,
            request_timeout_ms: 30_000,
            drain_timeout_ms: 20_000,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            commit_interval_ms: 1_000,
            writer_memory_bytes: 64 << 20,
            indexing_threads: 2,
            writer_threads: 2,
            max_open_writers: 8,
            writer_idle_ms: 10_000,
        }
    }
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("./models"),
            dense: DenseModel::Minilm,
            fine_mode: FineModeName::Late,
            inference_threads: 2,
            inference_memory_arena: true,
            inference_batch_tokens: 2048,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 64 << 20,
            max_top_k: 100,
            max_token_budget: 32_768,
            max_document_bytes: 16 << 20,
            max_query_bytes: 16 << 10,
            max_chunk_tokens: 8_192,
            max_batch_documents: 10_000,
            max_sections_per_document: 50_000,
            max_html_depth: 4_096,
        }
    }
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        Self {
            default_top_k: 8,
            default_chunk_tokens: 128,
            section_weight: 0.5,
            bm25_weight: 1.0,
            dense_weight: 1.0,
            rrf_k: 60.0,
            rrf_lexical_weight: 1.0,
            rrf_dense_weight: 1.0,
            ambiguous_diversity: 0.3,
            ambiguous_gap: 0.2,
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            result_bytes: 64 << 20,
            section_bytes: 64 << 20,
            query_vector_bytes: 16 << 20,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info,ort=warn,hnsw_rs=warn".to_string(),
            otlp_endpoint: String::new(),
        }
    }
}

/// Values given on the command line; they override the file and the environment.
#[derive(Clone, Debug, Default)]
pub struct ConfigOverrides {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub models_dir: Option<PathBuf>,
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

/// `Ok` when `ok` holds, else the error `message` (which names the field and its range).
fn check(ok: bool, message: &str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError(message.to_string()))
    }
}

impl Config {
    /// Defaults, then `file` (when given), then `LATHE_*` variables, then `overrides`.
    pub fn load(file: Option<&Path>, overrides: &ConfigOverrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file(path));
        }
        // Only LATHE_<SECTION>__<KEY> names are configuration: Kubernetes injects LATHE_PORT and
        // friends for a Service named `lathe`, and scripts use LATHE_MODELS_DIR and the like.
        figment = figment.merge(
            Env::prefixed("LATHE_")
                .filter(|key| key.as_str().contains("__"))
                .split("__"),
        );
        if let Some(listen) = overrides.listen {
            figment = figment.merge(Serialized::default("server.listen", listen));
        }
        if let Some(data_dir) = &overrides.data_dir {
            figment = figment.merge(Serialized::default("storage.data_dir", data_dir));
        }
        if let Some(models_dir) = &overrides.models_dir {
            figment = figment.merge(Serialized::default("models.dir", models_dir));
        }
        if let Some(format) = overrides.log_format {
            figment = figment.merge(Serialized::default("log.format", format));
        }
        let config: Config = figment
            .extract()
            .map_err(|error| ConfigError(error.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document on top of the defaults (no environment, no flags).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|error| ConfigError(error.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every section; the first value out of range is the error, named `section.field`
    /// with the range it must lie in.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_storage()?;
        self.validate_limits()?;
        self.validate_retrieval()?;
        self.validate_models()?;
        self.validate_tls()?;
        self.validate_replication()?;
        self.validate_listeners_and_log()
    }

    /// `replication`: a stream name NATS accepts, and limits that admit one entry.
    fn validate_replication(&self) -> Result<(), ConfigError> {
        let replication = &self.replication;
        check(
            (1..=32).contains(&replication.stream.len())
                && replication
                    .stream
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "replication.stream must be 1 to 32 characters of [A-Za-z0-9_-]",
        )?;
        check(
            (1..=5).contains(&replication.stream_replicas),
            "replication.stream_replicas must be in 1..=5",
        )?;
        check(
            replication.publish_timeout_ms >= 1,
            "replication.publish_timeout_ms must be at least 1",
        )?;
        check(
            replication.max_message_bytes == 0 || replication.max_message_bytes >= 4096,
            "replication.max_message_bytes must be 0 (the server's max_payload) or at least 4096",
        )?;
        check(
            (1..=10_000).contains(&replication.apply_batch),
            "replication.apply_batch must be in 1..=10000",
        )?;
        Ok(())
    }

    /// `server`: concurrency and the request timeout.
    fn validate_server(&self) -> Result<(), ConfigError> {
        check(
            self.server.max_concurrent_requests >= 1,
            "server.max_concurrent_requests must be at least 1",
        )?;
        check(
            self.server.request_timeout_ms >= 1,
            "server.request_timeout_ms must be at least 1",
        )?;
        Ok(())
    }

    /// `storage`: commit interval and the writers (tantivy bounds the memory of one).
    fn validate_storage(&self) -> Result<(), ConfigError> {
        check(
            (1..=MAX_DENSE_SEAL_VECTORS).contains(&self.dense.seal_vectors),
            &format!("dense.seal_vectors must be in 1..={MAX_DENSE_SEAL_VECTORS}"),
        )?;
        check(
            self.dense.rebuild_dead_share > 0.0 && self.dense.rebuild_dead_share < 1.0,
            "dense.rebuild_dead_share must be above 0 and below 1",
        )?;
        check(
            (1..=MAX_DENSE_EF_SEARCH).contains(&self.dense.ef_search),
            &format!("dense.ef_search must be in 1..={MAX_DENSE_EF_SEARCH}"),
        )?;
        check(
            self.dense.load_threads <= MAX_DENSE_LOAD_THREADS,
            &format!(
                "dense.load_threads must be in 0..={MAX_DENSE_LOAD_THREADS} (0: one per core)"
            ),
        )?;
        check(
            self.dense.max_segment_vectors == 0
                || self.dense.max_segment_vectors
                    >= DENSE_TIER_MERGE_FACTOR.saturating_mul(self.dense.seal_vectors),
            &format!(
                "dense.max_segment_vectors must be 0 (no limit) or at least \
                 {DENSE_TIER_MERGE_FACTOR} × dense.seal_vectors"
            ),
        )?;
        check(
            self.storage.commit_interval_ms >= 1,
            "storage.commit_interval_ms must be at least 1",
        )?;
        check(
            self.storage.writer_memory_bytes >= 15 << 20,
            "storage.writer_memory_bytes must be at least 15 MiB (tantivy's minimum)",
        )?;
        check(
            self.storage.writer_memory_bytes < (u32::MAX as usize) - 1_000_000,
            "storage.writer_memory_bytes must be below 4293967295 (tantivy's maximum for one indexing thread)",
        )?;
        check(
            (1..=8).contains(&self.storage.indexing_threads),
            "storage.indexing_threads must be in 1..=8",
        )?;
        check(
            (1..=64).contains(&self.storage.writer_threads),
            "storage.writer_threads must be in 1..=64",
        )?;
        check(
            self.storage.max_open_writers >= 1,
            "storage.max_open_writers must be at least 1",
        )?;
        check(
            self.storage.writer_idle_ms >= 1,
            "storage.writer_idle_ms must be at least 1",
        )?;
        Ok(())
    }

    /// `limits`: every limit admits at least one of its unit.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        check(
            self.limits.max_message_bytes >= 1024,
            "limits.max_message_bytes must be at least 1024",
        )?;
        check(
            self.limits.max_top_k >= 1,
            "limits.max_top_k must be at least 1",
        )?;
        check(
            self.limits.max_token_budget >= 1,
            "limits.max_token_budget must be at least 1",
        )?;
        check(
            self.limits.max_chunk_tokens >= 1,
            "limits.max_chunk_tokens must be at least 1",
        )?;
        check(
            self.limits.max_batch_documents >= 1,
            "limits.max_batch_documents must be at least 1",
        )?;
        check(
            self.limits.max_sections_per_document >= 1,
            "limits.max_sections_per_document must be at least 1",
        )?;
        Ok(())
    }

    /// `retrieval`: defaults within their limits, weights finite and not negative.
    fn validate_retrieval(&self) -> Result<(), ConfigError> {
        check(
            (1..=self.limits.max_top_k).contains(&self.retrieval.default_top_k),
            "retrieval.default_top_k must be in 1..=limits.max_top_k",
        )?;
        check(
            (1..=self.limits.max_chunk_tokens).contains(&self.retrieval.default_chunk_tokens),
            "retrieval.default_chunk_tokens must be in 1..=limits.max_chunk_tokens",
        )?;
        let retrieval = &self.retrieval;
        check(
            [
                retrieval.section_weight,
                retrieval.bm25_weight,
                retrieval.dense_weight,
                retrieval.rrf_lexical_weight,
                retrieval.rrf_dense_weight,
            ]
            .iter()
            .all(|w| w.is_finite() && *w >= 0.0),
            "retrieval weights must be finite and not negative",
        )?;
        check(
            retrieval.rrf_k.is_finite() && retrieval.rrf_k >= 0.0,
            "retrieval.rrf_k must be finite and not negative",
        )?;
        check(
            (0.0..=1.0).contains(&retrieval.ambiguous_diversity),
            "retrieval.ambiguous_diversity must be in 0..=1",
        )?;
        check(
            (0.0..=1.0).contains(&retrieval.ambiguous_gap),
            "retrieval.ambiguous_gap must be in 0..=1",
        )?;
        Ok(())
    }

    /// `models`: at least one inference thread; batches that hold one full-length sequence.
    fn validate_models(&self) -> Result<(), ConfigError> {
        check(
            self.models.inference_threads >= 1,
            "models.inference_threads must be at least 1",
        )?;
        check(
            (256..=65_536).contains(&self.models.inference_batch_tokens),
            "models.inference_batch_tokens must lie in 256..=65536",
        )?;
        Ok(())
    }

    /// `tls`: certificate and key together; a client CA only with them.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        if self.tls.enabled() {
            check(
                !self.tls.cert_file.is_empty() && !self.tls.key_file.is_empty(),
                "tls.cert_file and tls.key_file must be set together",
            )?;
        }
        check(
            self.tls.client_ca_file.is_empty() || self.tls.enabled(),
            "tls.client_ca_file needs tls.cert_file and tls.key_file",
        )?;
        Ok(())
    }

    /// The side listeners (metrics, health) and the OTLP export, in the order they were checked.
    fn validate_listeners_and_log(&self) -> Result<(), ConfigError> {
        if !self.server.metrics_listen.is_empty() {
            check(
                self.server.metrics_listen.parse::<SocketAddr>().is_ok(),
                "server.metrics_listen must be an address like 0.0.0.0:9090, or empty",
            )?;
        }
        check(
            self.log.otlp_endpoint.is_empty() || cfg!(feature = "otel"),
            "log.otlp_endpoint is set, but this lathe was built without the otel feature \
             (cargo build --release --features otel)",
        )?;
        if !self.server.health_listen.is_empty() {
            check(
                self.server.health_listen.parse::<SocketAddr>().is_ok(),
                "server.health_listen must be an address like 0.0.0.0:50052, or empty",
            )?;
        }
        Ok(())
    }

    pub fn cpu_threads(&self) -> usize {
        if self.server.cpu_threads > 0 {
            return self.server.cpu_threads;
        }
        std::thread::available_parallelism().map_or(2, |n| n.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_default_file_is_exactly_the_built_in_default() {
        let parsed = Config::from_toml(DEFAULT_CONFIG_TOML).expect("deploy/lathe.toml must load");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn an_otlp_endpoint_needs_the_otel_feature() {
        let result = Config::from_toml("[log]\notlp_endpoint = \"http://127.0.0.1:4317\"\n");
        if cfg!(feature = "otel") {
            assert!(result.is_ok(), "{result:?}");
        } else {
            let error = result.unwrap_err().to_string();
            assert!(
                error.contains("log.otlp_endpoint") && error.contains("without the otel feature"),
                "{error}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let error = Config::from_toml("[server]\nlisten_addr = \"0.0.0.0:1\"\n").unwrap_err();
        assert!(error.to_string().contains("listen_addr"), "{error}");
    }

    #[test]
    fn invalid_values_are_rejected_with_the_key() {
        let error = Config::from_toml("[limits]\nmax_top_k = 0\n").unwrap_err();
        assert!(error.to_string().contains("limits.max_top_k"), "{error}");
        let error = Config::from_toml("[dense]\nef_search = 0\n").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("dense.ef_search must be in 1..=4096"),
            "{error}"
        );
        let error = Config::from_toml("[dense]\nload_threads = 257\n").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("dense.load_threads must be in 0..=256"),
            "{error}"
        );
        assert!(Config::from_toml("[dense]\nload_threads = 1\n").is_ok());
        for (key, value) in [
            ("ambiguous_gap", "1.5"),
            ("ambiguous_gap", "nan"),
            ("ambiguous_diversity", "-0.1"),
        ] {
            let error = Config::from_toml(&format!("[retrieval]\n{key} = {value}\n")).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains(&format!("retrieval.{key} must be in 0..=1")),
                "{error}"
            );
        }
        assert!(Config::from_toml("[retrieval]\nambiguous_diversity = 0.0\n").is_ok());
        let error = Config::from_toml("[dense]\nseal_vectors = 100\nmax_segment_vectors = 399\n")
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("dense.max_segment_vectors must be 0 (no limit) or at least 4"),
            "{error}"
        );
        assert!(
            Config::from_toml("[dense]\nseal_vectors = 100\nmax_segment_vectors = 400\n").is_ok()
        );
        for tokens in [255, 65_537] {
            let error =
                Config::from_toml(&format!("[models]\ninference_batch_tokens = {tokens}\n"))
                    .unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("models.inference_batch_tokens must lie in 256..=65536"),
                "{error}"
            );
        }
        assert!(Config::from_toml("[models]\ninference_batch_tokens = 256\n").is_ok());
        for threads in [0, 9] {
            let error = Config::from_toml(&format!("[storage]\nindexing_threads = {threads}\n"))
                .unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("storage.indexing_threads must be in 1..=8"),
                "{error}"
            );
        }
        assert!(Config::from_toml("[storage]\nindexing_threads = 8\n").is_ok());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API returns its own error type
    fn environment_overrides_the_file_and_flags_override_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "lathe.toml",
                "[storage]\ndata_dir = \"/from/file\"\n[limits]\nmax_top_k = 50\n",
            )?;
            jail.set_env("LATHE_LIMITS__MAX_TOP_K", "20");
            jail.set_env("LATHE_STORAGE__DATA_DIR", "/from/env");
            jail.set_env("LATHE_PORT", "tcp://10.0.0.1:50051");
            let overrides = ConfigOverrides {
                data_dir: Some(PathBuf::from("/from/flag")),
                ..ConfigOverrides::default()
            };
            let config = Config::load(Some(Path::new("lathe.toml")), &overrides).expect("loads");
            assert_eq!(config.limits.max_top_k, 20);
            assert_eq!(config.storage.data_dir, PathBuf::from("/from/flag"));
            Ok(())
        });
    }
}
