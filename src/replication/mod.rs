//! Replicas fed by a replicated write log on NATS JetStream (on when `replication.nats_url` is
//! set; a single node otherwise, untouched by this module).
//!
//! The log is one JetStream stream that keeps one message per subject: a compacted log holding
//! the latest state of every collection and the latest version of every document (subjects in
//! `subjects`, entries in `proto/lathe/log/v1/log.proto`, converted by `codec`). A write is
//! validated, sectioned and embedded once, by the replica that takes it, and published whole
//! (`publish`); it is acknowledged once JetStream has stored it. Every replica — the one that
//! published included — applies the stream in order (`apply`) into its own indexes: the position
//! of the last applied entry is committed with each collection's index (tantivy's commit payload)
//! and, once a batch is committed everywhere, in `<data_dir>/replica.json` (`position`), so a
//! restart resumes exactly where it stopped. `state` is what a replica knows of its progress:
//! read-your-writes waits, readiness, lag.
//!
//! # Layout
//! - this file: [`Replication`]: the connection, the stream, and the calls the service makes.
//! - `subjects`: subject names; `codec`: entries ⇄ domain types, checked.
//! - `publish`: writes (inline, or split into parts for a version over one message).
//! - `apply`: the apply loop and the [`Applier`] the service implements.
//! - `position`: the replica's recorded position; `state`: its progress ([`Progress`]).
//! - `watch`: the log read on a timer: the lag from the log's own state, a stalled delivery
//!   restarted, the log's identity checked (a stream deleted, purged or made again is lost).
//! - `work`: the work stream of writes acknowledged before they are embedded, taken by any
//!   replica's index worker, and the stamps that keep every document's newest write in the log.
//! - `recover`: once the log is lost, what an operator decides (re-seed a new log from this
//!   replica's data, or start over from an empty one), and every replica's adopting of it.
//!
//! May call: `index` (record and settings types), `embed` (vector checks), `config`, the leaves.
//! Knows nothing of the pipeline, the service or gRPC.

pub mod apply;
pub mod codec;
pub mod position;
mod publish;
mod recover;
pub mod state;
mod subjects;
mod watch;
pub mod work;

#[allow(clippy::all, missing_docs)]
mod proto {
    include!(concat!(env!("OUT_DIR"), "/lathe.log.v1.rs"));
}

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::OnceCell;

pub use apply::{Applier, ApplyTask, Positioned};
pub use codec::{Entry, VectorStamp};
pub use recover::{Recovered, Recovery, Seed};
pub use state::{Progress, ReplicaState};
pub use work::{WorkItem, WORK_TOKEN};

use crate::config::ReplicationConfig;
use crate::error::{LatheError, Result};
use subjects::Subjects;

/// A message's headers and JetStream's own envelope take at most this much of `max_payload`.
const ENVELOPE_BYTES: usize = 4096;

/// This replica's link to the log.
pub struct Replication {
    config: ReplicationConfig,
    client: async_nats::Client,
    jetstream: jetstream::Context,
    subjects: Subjects,
    /// The stream, once it has been reached (created on first use by a replica that holds
    /// nothing of a log yet).
    stream: OnceCell<jetstream::stream::Stream>,
    /// The work stream of queued writes, once reached (see `work`).
    work: OnceCell<jetstream::stream::Stream>,
    state: Arc<ReplicaState>,
    data_dir: PathBuf,
    dedupe_window: Duration,
    /// The data dir holds data applied from a log: the stream is only ever opened, never made
    /// (a missing one is a lost log, not a new one).
    applied_from_log: bool,
    /// The log this replica follows, once its apply loop has checked it (see `watch`).
    identity: std::sync::Mutex<Option<watch::LogIdentity>>,
    /// Set by the watch when delivery stalls with entries waiting: the apply loop reads the log
    /// again from its position.
    kick: tokio::sync::Notify,
    /// True while the apply loop is applying a batch (not waiting for entries).
    applying: std::sync::atomic::AtomicBool,
    /// Held while this replica recovers a lost log (`recover`): its data is being read, so it
    /// adopts the new log only once that is done.
    recovering: tokio::sync::Mutex<()>,
}

impl Replication {
    /// Connects to NATS (in the background: the server starts and serves reads while NATS is
    /// unreachable, and writes answer UNAVAILABLE naming the URL until it is reached).
    /// `dedupe_window` is how long JetStream remembers a write's message ids (the stream's
    /// `duplicate_window`, set when this replica creates the stream): a write sent again with
    /// its `write_id` within it is stored once.
    pub async fn connect(
        config: &ReplicationConfig,
        data_dir: &Path,
        dedupe_window: Duration,
    ) -> Result<Arc<Self>> {
        let url = config.nats_url.trim().to_string();
        let servers: Vec<async_nats::ServerAddr> = url
            .split(',')
            .map(|server| {
                server.trim().parse().map_err(|e| {
                    LatheError::invalid(
                        "replication.nats_url",
                        format!("`{server}` is not a NATS URL: {e}"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let events_url = url.clone();
        let client = async_nats::ConnectOptions::new()
            .name("lathe")
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .event_callback(move |event| {
                let url = events_url.clone();
                async move { log_connection_event(&url, &event) }
            })
            .connect(servers)
            .await
            .map_err(|e| log_unavailable(&url, e))?;
        let mut jetstream = jetstream::new(client.clone());
        jetstream.set_timeout(Duration::from_millis(config.publish_timeout_ms));
        let state = Arc::new(ReplicaState::new(&url));
        // What this data dir holds is served before the log is reached (and checked against it
        // once it is: a data dir of another log stops the apply loop).
        let recorded = position::load(data_dir)?;
        if let Some(recorded) = &recorded {
            state.update(|progress| progress.applied = recorded.applied);
        }
        Ok(Arc::new(Self {
            subjects: Subjects::new(&config.stream),
            config: config.clone(),
            client,
            jetstream,
            stream: OnceCell::new(),
            work: OnceCell::new(),
            state,
            data_dir: data_dir.to_path_buf(),
            dedupe_window,
            applied_from_log: recorded.is_some(),
            identity: std::sync::Mutex::new(None),
            kick: tokio::sync::Notify::new(),
            applying: std::sync::atomic::AtomicBool::new(false),
            recovering: tokio::sync::Mutex::new(()),
        }))
    }

    pub fn url(&self) -> &str {
        self.config.nats_url.trim()
    }

    pub fn state(&self) -> &Arc<ReplicaState> {
        &self.state
    }

    pub fn max_lag(&self) -> Duration {
        Duration::from_secs(self.config.max_lag_seconds)
    }

    /// The stream, created with the log's settings on first use by a replica that holds nothing
    /// of a log yet (one that does only opens it: a missing stream is a lost log); an existing
    /// stream whose settings would break the log (more than one message per subject, other
    /// subjects) is refused rather than used. FAILED_PRECONDITION once the log is lost.
    async fn stream(&self) -> Result<&jetstream::stream::Stream> {
        self.check_log()?;
        self.check_connected()?;
        self.stream
            .get_or_try_init(|| async {
                let wanted = self.wanted_stream();
                let stream = if self.applied_from_log {
                    self.open_existing_stream().await?
                } else {
                    self.jetstream
                        .get_or_create_stream(wanted.clone())
                        .await
                        .map_err(|e| stream_error(self.url(), &wanted.name, e))?
                };
                let found = &stream.cached_info().config;
                check_stream(found, &wanted)?;
                if found.duplicate_window < wanted.duplicate_window {
                    tracing::warn!(
                        stream = found.name,
                        duplicate_window_s = found.duplicate_window.as_secs(),
                        dedupe_window_s = wanted.duplicate_window.as_secs(),
                        "the stream remembers write ids for less than ingest.dedupe_window_s (it was made before); a write sent again after its window is stored again"
                    );
                }
                Ok(stream)
            })
            .await
    }

    /// The stream's settings the log needs.
    fn wanted_stream(&self) -> jetstream::stream::Config {
        jetstream::stream::Config {
            name: self.config.stream.clone(),
            subjects: self.subjects.stream_subjects(),
            max_messages_per_subject: 1,
            storage: jetstream::stream::StorageType::File,
            num_replicas: self.config.stream_replicas,
            allow_direct: true,
            duplicate_window: self.dedupe_window,
            ..Default::default()
        }
    }

    fn check_connected(&self) -> Result<()> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(log_unavailable(
                self.url(),
                format!("not connected ({state})"),
            )),
        }
    }

    /// Largest message this replica publishes: the configured size, at most what the server
    /// takes.
    pub fn max_message_bytes(&self) -> usize {
        let server = self.client.server_info().max_payload;
        let server = if server == 0 { 1 << 20 } else { server };
        let configured = match self.config.max_message_bytes {
            0 => server,
            bytes => bytes.min(server),
        };
        configured.saturating_sub(ENVELOPE_BYTES).max(1024)
    }
}

/// A failure to create or open the stream: a configuration JetStream refuses (its subjects
/// overlap another stream's) is FAILED_PRECONDITION naming the fix, anything else UNAVAILABLE.
fn stream_error(url: &str, stream: &str, error: impl std::fmt::Display) -> LatheError {
    let message = error.to_string();
    if message.contains("subjects overlap") || message.contains("10065") {
        return LatheError::Precondition(format!(
            "the JetStream stream `{stream}` at {url} cannot be made: {message}. Another stream takes the same subjects (stream names differ only in case, or another deployment's stream): set replication.stream to the same name on every replica, or delete the other stream"
        ));
    }
    log_unavailable(url, message)
}

/// The settings the log depends on: one message per subject (else the stream is not a
/// compacted log and replicas would replay every old version) and its subjects.
fn check_stream(
    found: &jetstream::stream::Config,
    wanted: &jetstream::stream::Config,
) -> Result<()> {
    let mut found_subjects = found.subjects.clone();
    found_subjects.sort();
    let mut wanted_subjects = wanted.subjects.clone();
    wanted_subjects.sort();
    if found.max_messages_per_subject == 1 && found_subjects == wanted_subjects {
        return Ok(());
    }
    Err(LatheError::Precondition(format!(
        "the JetStream stream `{}` exists with max_msgs_per_subject {} and subjects {:?}; the log needs 1 and {:?}: name another replication.stream, or delete that stream",
        found.name, found.max_messages_per_subject, found.subjects, wanted.subjects
    )))
}

fn log_unavailable(url: &str, cause: impl std::fmt::Display) -> LatheError {
    LatheError::LogUnavailable {
        url: url.to_string(),
        cause: cause.to_string(),
        stored: None,
    }
}

fn log_connection_event(url: &str, event: &async_nats::Event) {
    match event {
        async_nats::Event::Connected => tracing::info!(url, "connected to the write log"),
        async_nats::Event::Disconnected => {
            tracing::warn!(
                url,
                "disconnected from the write log; writes answer UNAVAILABLE, reads go on"
            )
        }
        other => tracing::warn!(url, event = %other, "write log connection"),
    }
}
