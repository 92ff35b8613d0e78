//! The checks of a loaded configuration: every value in its range, the first one out of range
//! the error, named `section.field` with the range it must lie in.

use std::net::SocketAddr;

use super::{
    check, Config, ConfigError, DENSE_TIER_MERGE_FACTOR, MAX_DENSE_EF_SEARCH,
    MAX_DENSE_LOAD_THREADS, MAX_DENSE_SEAL_VECTORS,
};

impl Config {
    /// Checks every section; the first value out of range is the error, named `section.field`
    /// with the range it must lie in.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_storage()?;
        self.validate_limits()?;
        self.validate_ingest()?;
        self.validate_retrieval()?;
        self.validate_models()?;
        self.validate_tls()?;
        self.validate_replication()?;
        self.validate_listeners_and_log()
    }

    /// `ingest`: a queue that takes a write, windows of at least a second.
    fn validate_ingest(&self) -> Result<(), ConfigError> {
        let ingest = &self.ingest;
        check(
            ingest.max_queued_bytes >= 1 << 20,
            "ingest.max_queued_bytes must be at least 1048576 (1 MiB)",
        )?;
        check(
            ingest.max_queued_bytes_total >= ingest.max_queued_bytes,
            "ingest.max_queued_bytes_total must be at least ingest.max_queued_bytes",
        )?;
        check(
            (1..=30 * 24 * 3600).contains(&ingest.dedupe_window_s),
            "ingest.dedupe_window_s must be in 1..=2592000 (30 days)",
        )?;
        check(
            (1..=30 * 24 * 3600).contains(&ingest.operations_retention_s),
            "ingest.operations_retention_s must be in 1..=2592000 (30 days)",
        )?;
        check(
            (1024..=64 << 20).contains(&ingest.apply_batch_bytes),
            "ingest.apply_batch_bytes must be in 1024..=67108864",
        )?;
        check(
            (0..=19).contains(&ingest.worker_nice),
            "ingest.worker_nice must be in 0..=19",
        )
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
        check(
            (100..=60_000).contains(&replication.watch_interval_ms),
            "replication.watch_interval_ms must be in 100..=60000",
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
            (1..=MAX_DENSE_SEAL_VECTORS).contains(&self.dense.close_seal_min_vectors),
            &format!("dense.close_seal_min_vectors must be in 1..={MAX_DENSE_SEAL_VECTORS}"),
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
            (1..=100_000).contains(&self.storage.max_open_collections),
            "storage.max_open_collections must be in 1..=100000",
        )?;
        check(
            self.storage.writer_idle_ms >= 1,
            "storage.writer_idle_ms must be at least 1",
        )?;
        check(
            self.storage.scrub_bytes_per_second == 0
                || self.storage.scrub_bytes_per_second >= 1 << 20,
            "storage.scrub_bytes_per_second must be 0 (unpaced) or at least 1048576",
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
        if !self.server.http_listen.is_empty() {
            check(
                self.server.http_listen.parse::<SocketAddr>().is_ok(),
                "server.http_listen must be an address like 0.0.0.0:8080, or empty",
            )?;
        }
        Ok(())
    }
}
