//! Prometheus metrics, with bounded label sets: requests by RPC and status code, latency per RPC
//! and per pipeline stage, cache hits and misses by cache, in-flight requests, embedding batches,
//! collections by state, per-collection sizes and faults, and the index writers open (read at
//! scrape time).

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
    pub requests: IntCounterVec,
    pub request_seconds: HistogramVec,
    pub stage_seconds: HistogramVec,
    pub cache_lookups: IntCounterVec,
    pub in_flight: IntGauge,
    pub embedding_batches: IntCounterVec,
    pub embedding_batch_seconds: HistogramVec,
    pub collection_documents: IntGaugeVec,
    pub collection_sections: IntGaugeVec,
    pub collection_bytes: IntGaugeVec,
    /// Collections by state: ready, damaged, offline.
    pub collections: IntGaugeVec,
    /// 1 for a collection that cannot serve (damaged or offline), 0 for a ready one.
    pub collection_damaged: IntGaugeVec,
    pub index_writers_open: IntGauge,
    pub index_writer_evictions: IntCounter,
}

impl Metrics {
    /// Adds a metric kept by another module (e.g. the dense index's search wait); one already
    /// registered is left as it is.
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        let _ = self.registry.register(collector);
    }

    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("lathe".into()), None)
            .expect("static registry options are valid");
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                labels,
            )
            .expect("static metric")
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("static metric")
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric")
        };
        let metrics = Self {
            requests: counter(
                "requests_total",
                "gRPC requests by RPC and status code",
                &["rpc", "code"],
            ),
            request_seconds: histogram(
                "request_duration_seconds",
                "gRPC request latency by RPC",
                &["rpc"],
            ),
            stage_seconds: histogram(
                "stage_duration_seconds",
                "Retrieve pipeline stage latency",
                &["stage"],
            ),
            cache_lookups: counter(
                "cache_lookups_total",
                "Cache lookups by cache and result",
                &["cache", "result"],
            ),
            in_flight: IntGauge::new("requests_in_flight", "gRPC requests being served")
                .expect("static metric"),
            embedding_batches: counter(
                "embedding_batches_total",
                "Embedding model batches by model",
                &["model"],
            ),
            embedding_batch_seconds: histogram(
                "embedding_batch_duration_seconds",
                "Embedding batch latency",
                &["model"],
            ),
            collection_documents: gauge(
                "collection_documents",
                "Documents per collection",
                &["collection"],
            ),
            collection_sections: gauge(
                "collection_sections",
                "Sections per collection",
                &["collection"],
            ),
            collection_bytes: gauge(
                "collection_bytes",
                "Document text bytes per collection",
                &["collection"],
            ),
            collections: gauge(
                "collections",
                "Collections by state (ready, damaged, offline)",
                &["state"],
            ),
            collection_damaged: gauge(
                "collection_damaged",
                "1 when the collection cannot serve (damaged or offline; ListCollections gives the file and the cause), else 0",
                &["collection"],
            ),
            index_writers_open: IntGauge::new(
                "index_writers_open",
                "Collections holding an open index writer (at most storage.max_open_writers)",
            )
            .expect("static metric"),
            index_writer_evictions: IntCounter::new(
                "index_writer_evictions_total",
                "Index writers committed and closed to make room for another collection's",
            )
            .expect("static metric"),
            registry,
        };
        for collector in [
            Box::new(metrics.requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(metrics.request_seconds.clone()),
            Box::new(metrics.stage_seconds.clone()),
            Box::new(metrics.cache_lookups.clone()),
            Box::new(metrics.in_flight.clone()),
            Box::new(metrics.embedding_batches.clone()),
            Box::new(metrics.embedding_batch_seconds.clone()),
            Box::new(metrics.collection_documents.clone()),
            Box::new(metrics.collection_sections.clone()),
            Box::new(metrics.collection_bytes.clone()),
            Box::new(metrics.collections.clone()),
            Box::new(metrics.collection_damaged.clone()),
            Box::new(metrics.index_writers_open.clone()),
            Box::new(metrics.index_writer_evictions.clone()),
        ] {
            metrics
                .registry
                .register(collector)
                .expect("each metric is registered once");
        }
        metrics
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
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
        let text = metrics.render();
        for series in [
            "lathe_requests_total{code=\"Ok\",rpc=\"Retrieve\"} 1",
            "lathe_stage_duration_seconds_bucket",
            "lathe_cache_lookups_total{cache=\"result\",result=\"hit\"} 1",
            "lathe_requests_in_flight 0",
        ] {
            assert!(text.contains(series), "missing {series} in\n{text}");
        }
    }
}
