//! The `server`, `tls`, `auth`, `log` and `replication` sections: how the process listens,
//! whom it admits, what it logs, and the write log it shares with other replicas.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

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
    /// Address of the HTTP/JSON API (the RPCs under `/v1/`, proto3 JSON, OpenAPI at
    /// `/v1/openapi.json`), with the same keys, limits and TLS as the gRPC port; empty = off.
    pub http_listen: String,
    /// Threads of the bounded CPU pool for search, chunking and inference (0 = one per core).
    pub cpu_threads: usize,
    /// Requests served at once; more are shed with RESOURCE_EXHAUSTED.
    pub max_concurrent_requests: usize,
    /// Deadline for one request when the client sets none (milliseconds).
    pub request_timeout_ms: u64,
    /// Time given to in-flight requests after SIGTERM (milliseconds).
    pub drain_timeout_ms: u64,
    /// How often the TLS files and the API keys file are checked for changes (milliseconds):
    /// changed files are served from the next connection or call, without a restart. 0 = never.
    pub reload_interval_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: String::new(),
            health_listen: String::new(),
            http_listen: String::new(),
            cpu_threads: 0,
            max_concurrent_requests: 256,
            request_timeout_ms: 30_000,
            drain_timeout_ms: 20_000,
            reload_interval_ms: 10_000,
        }
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

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info,ort=warn,hnsw_rs=warn".to_string(),
            otlp_endpoint: String::new(),
        }
    }
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
    /// A replica missing a log entry stored more than this long ago reports NOT_SERVING until
    /// it has caught up again (seconds; 0 = never).
    pub max_lag_seconds: u64,
    /// How often a replica reads the log's own state (its head, the oldest entry it has not
    /// applied, its identity): the lag is measured from it, a stalled delivery is restarted
    /// from it, and a log deleted, purged or made again is noticed by it (milliseconds).
    pub watch_interval_ms: u64,
    /// Largest message published, in bytes; a document version larger than this is split into
    /// parts. 0 = the NATS server's `max_payload`.
    pub max_message_bytes: usize,
    /// Log entries applied together: one commit per collection per batch.
    pub apply_batch: usize,
    /// Whether a write without `wait` is queued in the work stream and acknowledged before it
    /// is embedded (any replica's index worker embeds it); false: the replica that takes it
    /// embeds it and publishes it to the log before acknowledging it.
    pub queue_writes: bool,
    /// Whether this replica takes writes queued in the work stream (`<stream>_WORK`), embeds
    /// them and publishes them to the log. Writes without `wait` are queued there: at least
    /// one replica of a deployment must run a worker, or they are never applied.
    pub index_worker: bool,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            nats_url: String::new(),
            stream: "LATHE".to_string(),
            stream_replicas: 1,
            publish_timeout_ms: 5_000,
            max_lag_seconds: 60,
            watch_interval_ms: 2_000,
            max_message_bytes: 0,
            apply_batch: 512,
            queue_writes: true,
            index_worker: true,
        }
    }
}

impl ReplicationConfig {
    pub fn enabled(&self) -> bool {
        !self.nats_url.trim().is_empty()
    }
}
