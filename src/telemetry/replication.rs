//! The replication family of metrics: a replica's progress through the log, its faults, and the
//! work stream of queued writes (all zero on a single node).

use prometheus::{IntCounterVec, IntGauge, Registry};

use super::{counter, register};

/// The replication family (all zero on a single node).
pub struct ReplicationMetrics {
    /// Every log entry up to this position is applied here.
    pub applied_position: IntGauge,
    /// Entries the log holds after it, when last known.
    pub pending_entries: IntGauge,
    /// How far behind the replica may be (`Progress::lag`).
    pub lag_seconds: prometheus::Gauge,
    /// 1 once the apply loop stopped on an entry it cannot apply.
    /// 1 once the log is lost.
    pub log_lost: IntGauge,
    pub stopped: IntGauge,
    /// 1 while an apply is being retried after a failure.
    pub retrying: IntGauge,
    /// Document entries by outcome: `applied`, or passed over as `no_collection` (deleted or never
    /// created here), `earlier_incarnation`, `already_applied`, `not_replicated` (a collection
    /// created before replication was on), `collection_unavailable` (damaged or offline here).
    pub entries: IntCounterVec,
    /// The work stream of queued writes: messages, bytes, and the age of the oldest.
    pub work_messages: IntGauge,
    pub work_bytes: IntGauge,
    pub work_oldest_seconds: prometheus::Gauge,
}

impl ReplicationMetrics {
    pub(super) fn register(registry: &Registry) -> Self {
        let int_gauge = |name: &str, help: &str| {
            register(registry, IntGauge::new(name, help).expect("static metric"))
        };
        Self {
            applied_position: int_gauge(
                "replication_applied_position",
                "Log position up to which every entry is applied on this replica",
            ),
            pending_entries: int_gauge(
                "replication_pending_entries",
                "Log positions after the applied one (entries and parts), when last known",
            ),
            lag_seconds: register(
                registry,
                prometheus::Gauge::new(
                    "replication_lag_seconds",
                    "How far behind this replica may be: the age of the oldest log entry it has not applied, else since it last read the log's head",
                )
                .expect("static metric"),
            ),
            work_messages: int_gauge(
                "replication_work_queue_messages",
                "Writes queued in the work stream, not yet embedded and published to the log (each message up to 128 KiB of documents), when last read",
            ),
            work_bytes: int_gauge(
                "replication_work_queue_bytes",
                "Bytes of writes queued in the work stream, when last read",
            ),
            work_oldest_seconds: register(
                registry,
                prometheus::Gauge::new(
                    "replication_work_queue_oldest_seconds",
                    "Age of the oldest write queued in the work stream (0 when none waits)",
                )
                .expect("static metric"),
            ),
            log_lost: int_gauge(
                "replication_log_lost",
                "1 once the log this replica's data came from is gone (deleted, purged or made again): applying stopped, writes refused",
            ),
            stopped: int_gauge(
                "replication_stopped",
                "1 once applying the log stopped on an entry this replica cannot apply",
            ),
            retrying: int_gauge(
                "replication_retrying",
                "1 while a batch of log entries is being retried after a failure",
            ),
            entries: counter(
                registry,
                "replication_entries_total",
                "Document log entries applied or passed over, by outcome",
                &["outcome"],
            ),
        }
    }
}
