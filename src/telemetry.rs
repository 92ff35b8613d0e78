//! Prometheus metrics, with bounded label sets: requests by RPC and status code, latency per RPC
//! and per pipeline stage, cache hits and misses by cache, in-flight requests, embedding batches,
//! upserted sections embedded or reused, the model runtime's runs and time, collections by state,
//! per-collection sizes and faults, and the index writers open (read at scrape time).

mod replication;

pub use replication::ReplicationMetrics;

use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Latency buckets from 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

pub struct Metrics {
    registry: Registry,
    /// The standard `process_*` series (CPU seconds, resident and virtual memory, open and
    /// maximum file descriptors, threads, start time), unprefixed as every exporter names them.
    process: Registry,
    pub requests: IntCounterVec,
    pub request_seconds: HistogramVec,
    pub stage_seconds: HistogramVec,
    pub cache_lookups: IntCounterVec,
    pub in_flight: IntGauge,
    pub embedding_batches: IntCounterVec,
    pub embedding_batch_seconds: HistogramVec,
    /// Upserted sections by `outcome`: `embedded` (sent to the model) or `reused` (stored vectors).
    pub embed_sections: IntCounterVec,
    pub collection_documents: IntGaugeVec,
    pub collection_sections: IntGaugeVec,
    pub collection_bytes: IntGaugeVec,
    /// Collections by state: ready, damaged, offline.
    pub collections: IntGaugeVec,
    /// 1 for a collection that cannot serve (damaged or offline), 0 for a ready one.
    pub collection_damaged: IntGaugeVec,
    pub index_writers_open: IntGauge,
    pub index_writer_evictions: IntCounter,
    /// Collections open now, and idle ones closed (`storage.max_open_collections`).
    pub collections_open: IntGauge,
    pub collection_closes: IntCounter,
    /// The scrub: bytes read again, and files found changed (`storage.scrub_interval_s`).
    pub scrub_bytes: IntCounter,
    pub scrub_findings: IntCounter,
    /// The embedding model's runtime (read at scrape time; zero without a model that runs one).
    pub inference: InferenceMetrics,
    /// With replication: this replica's progress through the log (read at scrape time) and the
    /// entries it applied or passed over, by `outcome`.
    pub replication: ReplicationMetrics,
    /// The single node's write queue: depth and age (read at scrape time), what was applied.
    pub write_queue: WriteQueueMetrics,
    /// 1 while `lathe.v1.Lathe`'s health answers SERVING (read at scrape time).
    pub serving: IntGauge,
}

/// The write queue (single node).
pub struct WriteQueueMetrics {
    pub documents: IntGaugeVec,
    pub bytes: IntGaugeVec,
    pub oldest_seconds: prometheus::GaugeVec,
    /// Operations ended, by `outcome`: applied or failed.
    pub operations: IntCounterVec,
    pub applied_documents: IntCounter,
    pub applied_bytes: IntCounter,
}

impl WriteQueueMetrics {
    fn register(registry: &Registry) -> Self {
        let per_collection = |name: &str, help: &str| gauge(registry, name, help, &["collection"]);
        Self {
            documents: per_collection(
                "write_queue_documents",
                "Documents of acknowledged writes waiting to be applied, per collection",
            ),
            bytes: per_collection(
                "write_queue_bytes",
                "Bytes of acknowledged writes waiting to be applied, per collection",
            ),
            oldest_seconds: register(
                registry,
                prometheus::GaugeVec::new(
                    Opts::new(
                        "write_queue_oldest_seconds",
                        "Age of the oldest write waiting to be applied, per collection",
                    ),
                    &["collection"],
                )
                .expect("static metric"),
            ),
            operations: counter(
                registry,
                "write_operations_total",
                "Queued writes ended, by outcome: applied or failed",
                &["outcome"],
            ),
            applied_documents: register(
                registry,
                IntCounter::new(
                    "write_queue_applied_documents_total",
                    "Documents applied from the write queue (rate: the apply rate)",
                )
                .expect("static metric"),
            ),
            applied_bytes: register(
                registry,
                IntCounter::new(
                    "write_queue_applied_bytes_total",
                    "Bytes of text applied from the write queue (rate: the apply rate)",
                )
                .expect("static metric"),
            ),
        }
    }
}

/// The model runtime's totals since start (the embedder's, published at scrape time).
pub struct InferenceMetrics {
    pub runs: IntCounter,
    pub sequences: IntCounter,
    pub padded_tokens: IntCounter,
    /// Wall time inside the runtime's runs, summed over runs that overlapped.
    pub seconds: prometheus::Counter,
}

impl InferenceMetrics {
    fn register(registry: &Registry) -> Self {
        let int_counter = |name: &str, help: &str| {
            register(
                registry,
                IntCounter::new(name, help).expect("static metric"),
            )
        };
        Self {
            runs: int_counter(
                "inference_runs_total",
                "Batches the embedding model's runtime ran (ingest and queries)",
            ),
            sequences: int_counter(
                "inference_sequences_total",
                "Sequences (model inputs) in those batches",
            ),
            padded_tokens: int_counter(
                "inference_padded_tokens_total",
                "Tokens in those batches, padding included",
            ),
            seconds: register(
                registry,
                prometheus::Counter::new(
                    "inference_seconds_total",
                    "Wall time inside the model runtime's runs, summed over runs that overlapped; tokenizing and pooling are not in it",
                )
                .expect("static metric"),
            ),
        }
    }

    /// Brings the counters up to the embedder's totals, which only grow.
    pub fn publish(&self, totals: InferenceCounts) {
        self.runs
            .inc_by(totals.runs.saturating_sub(self.runs.get()));
        self.sequences
            .inc_by(totals.sequences.saturating_sub(self.sequences.get()));
        self.padded_tokens.inc_by(
            totals
                .padded_tokens
                .saturating_sub(self.padded_tokens.get()),
        );
        let seconds = totals.seconds - self.seconds.get();
        if seconds > 0.0 {
            self.seconds.inc_by(seconds);
        }
    }
}

/// What [`InferenceMetrics::publish`] brings the counters up to.
#[derive(Clone, Copy, Debug, Default)]
pub struct InferenceCounts {
    pub runs: u64,
    pub sequences: u64,
    pub padded_tokens: u64,
    pub seconds: f64,
}

/// Registers `collector` in `registry` and hands it back; each metric is registered once, with a
/// static name, so registering cannot fail.
fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> C {
    registry
        .register(Box::new(collector.clone()))
        .expect("each metric is registered once");
    collector
}

/// A latency histogram (seconds, [`LATENCY_BUCKETS`]) with `labels`, registered.
fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let options = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    register(
        registry,
        HistogramVec::new(options, labels).expect("static metric"),
    )
}

/// A counter with `labels`, registered.
fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("static metric"),
    )
}

/// A gauge with `labels`, registered.
fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric"),
    )
}

/// The gRPC family: requests by RPC and code, latency by RPC, requests in flight.
struct RequestMetrics {
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    in_flight: IntGauge,
}

impl RequestMetrics {
    fn register(registry: &Registry) -> Self {
        Self {
            requests: counter(
                registry,
                "requests_total",
                "gRPC requests by RPC and status code",
                &["rpc", "code"],
            ),
            request_seconds: histogram(
                registry,
                "request_duration_seconds",
                "gRPC request latency by RPC",
                &["rpc"],
            ),
            in_flight: register(
                registry,
                IntGauge::new("requests_in_flight", "gRPC requests being served")
                    .expect("static metric"),
            ),
        }
    }
}

/// The pipeline family: stage latency, cache lookups, embedding batches.
struct PipelineMetrics {
    stage_seconds: HistogramVec,
    cache_lookups: IntCounterVec,
    embedding_batches: IntCounterVec,
    embedding_batch_seconds: HistogramVec,
    embed_sections: IntCounterVec,
}

impl PipelineMetrics {
    fn register(registry: &Registry) -> Self {
        Self {
            stage_seconds: histogram(
                registry,
                "stage_duration_seconds",
                "Retrieve pipeline stage latency",
                &["stage"],
            ),
            cache_lookups: counter(
                registry,
                "cache_lookups_total",
                "Cache lookups by cache and result",
                &["cache", "result"],
            ),
            embedding_batches: counter(
                registry,
                "embedding_batches_total",
                "Embedding model batches by model",
                &["model"],
            ),
            embedding_batch_seconds: histogram(
                registry,
                "embedding_batch_duration_seconds",
                "Embedding batch latency",
                &["model"],
            ),
            embed_sections: counter(
                registry,
                "embed_sections_total",
                "Upserted sections by where their vectors came from: embedded or reused",
                &["outcome"],
            ),
        }
    }
}

/// The collection family: sizes and state per collection, read at scrape time.
struct CollectionMetrics {
    documents: IntGaugeVec,
    sections: IntGaugeVec,
    bytes: IntGaugeVec,
    by_state: IntGaugeVec,
    damaged: IntGaugeVec,
    open: IntGauge,
    closes: IntCounter,
}

impl CollectionMetrics {
    fn register(registry: &Registry) -> Self {
        let per_collection = |name: &str, help: &str| gauge(registry, name, help, &["collection"]);
        Self {
            documents: per_collection("collection_documents", "Documents per collection"),
            sections: per_collection("collection_sections", "Sections per collection"),
            bytes: per_collection("collection_bytes", "Document text bytes per collection"),
            by_state: gauge(
                registry,
                "collections",
                "Collections by state (ready, damaged, offline)",
                &["state"],
            ),
            damaged: per_collection(
                "collection_damaged",
                "1 when the collection cannot serve (damaged or offline; ListCollections gives the file and the cause), else 0",
            ),
            open: register(registry, IntGauge::new("collections_open", "Collections whose index is open (about storage.max_open_collections at most; the rest open on first use)").expect("static metric")),
            closes: register(registry, IntCounter::new("collection_closes_total", "Idle collections closed to keep the open ones within storage.max_open_collections").expect("static metric")),
        }
    }
}

impl Metrics {
    /// Adds a metric kept by another module (e.g. the dense index's search wait); one already
    /// registered is left as it is.
    pub fn register(&self, collector: Box<dyn Collector>) {
        let _ = self.registry.register(collector);
    }

    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("lathe".into()), None)
            .expect("static registry options are valid");
        let request = RequestMetrics::register(&registry);
        let pipeline = PipelineMetrics::register(&registry);
        let collection = CollectionMetrics::register(&registry);
        let index_writers_open = IntGauge::new(
            "index_writers_open",
            "Collections holding an open index writer (at most storage.max_open_writers)",
        )
        .expect("static metric");
        let index_writer_evictions = IntCounter::new(
            "index_writer_evictions_total",
            "Index writers committed and closed to make room for another collection's",
        )
        .expect("static metric");
        let counter_of = |name: &str, help: &str| {
            register(
                &registry,
                IntCounter::new(name, help).expect("static metric"),
            )
        };
        let scrub_bytes = counter_of(
            "scrub_bytes_total",
            "Bytes of collection files read again and checked by the scrub",
        );
        let scrub_findings = counter_of(
            "scrub_findings_total",
            "Files the scrub found changed on disk (a tantivy file: its collection is damaged; a dense segment: rebuilt)",
        );
        let build_info = register(
            &registry,
            IntGaugeVec::new(
                prometheus::Opts::new("build_info", "1, labelled with the running build's version"),
                &["version"],
            )
            .expect("static metric"),
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let process = Registry::new();
        #[cfg(target_os = "linux")]
        let _ = process.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        Self {
            process,
            scrub_bytes,
            scrub_findings,
            requests: request.requests,
            request_seconds: request.request_seconds,
            in_flight: request.in_flight,
            stage_seconds: pipeline.stage_seconds,
            cache_lookups: pipeline.cache_lookups,
            embedding_batches: pipeline.embedding_batches,
            embedding_batch_seconds: pipeline.embedding_batch_seconds,
            embed_sections: pipeline.embed_sections,
            collection_documents: collection.documents,
            collection_sections: collection.sections,
            collection_bytes: collection.bytes,
            collections: collection.by_state,
            collection_damaged: collection.damaged,
            collections_open: collection.open,
            collection_closes: collection.closes,
            index_writers_open: register(&registry, index_writers_open),
            index_writer_evictions: register(&registry, index_writer_evictions),
            inference: InferenceMetrics::register(&registry),
            replication: ReplicationMetrics::register(&registry),
            write_queue: WriteQueueMetrics::register(&registry),
            serving: register(
                &registry,
                IntGauge::new(
                    "serving",
                    "1 while lathe.v1.Lathe's health answers SERVING (loaded, not draining, a replica within replication.max_lag_seconds), else 0",
                )
                .expect("static metric"),
            ),
            registry,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        let _ = TextEncoder::new().encode(&families, &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_listed_series() {
        let metrics = Metrics::new();
        metrics
            .requests
            .with_label_values(&["Retrieve", "Ok"])
            .inc();
        metrics
            .stage_seconds
            .with_label_values(&["pack"])
            .observe(0.001);
        metrics
            .cache_lookups
            .with_label_values(&["result", "hit"])
            .inc();
        metrics.inference.publish(InferenceCounts {
            runs: 3,
            sequences: 40,
            padded_tokens: 5_000,
            seconds: 1.5,
        });
        // Publishing the same totals again adds nothing.
        metrics.inference.publish(InferenceCounts {
            runs: 3,
            sequences: 40,
            padded_tokens: 5_000,
            seconds: 1.5,
        });
        let text = metrics.render();
        for series in [
            "lathe_inference_runs_total 3",
            "lathe_inference_sequences_total 40",
            "lathe_inference_padded_tokens_total 5000",
            "lathe_inference_seconds_total 1.5",
            "lathe_requests_total{code=\"Ok\",rpc=\"Retrieve\"} 1",
            "lathe_stage_duration_seconds_bucket",
            "lathe_cache_lookups_total{cache=\"result\",result=\"hit\"} 1",
            "lathe_requests_in_flight 0",
            concat!(
                "lathe_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(text.contains(series), "missing {series} in\n{text}");
        }
    }
}
