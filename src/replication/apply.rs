//! The apply loop: reads the log in stream order from just after this replica's recorded
//! position (an ordered consumer: JetStream's ephemeral, ack-less consumer that the client
//! recreates from the last sequence it delivered whenever a message goes missing or the
//! connection drops), decodes each entry, takes whatever else is already waiting (up to
//! `replication.apply_batch` entries), hands the batch to the service's [`Applier`] and, once it
//! is committed, records the position.
//!
//! Nothing is skipped silently: an entry that cannot be decoded stops the loop for good (the
//! replica keeps serving what it has, reports NOT_SERVING and logs the entry's sequence and
//! subject); a batch the indexes cannot take (a full disk) is retried with backoff until it
//! goes through, the replica NOT_SERVING once it falls behind. The one entry passed over is a
//! split version whose parts were purged because a newer version of its document is stored,
//! which the loop checks before moving on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use super::codec::{self, Decoded, Entry, Malformed, PartsRef};
use super::position::{self, ReplicaPosition};
use super::watch::LogIdentity;
use super::Replication;
use crate::error::{LatheError, Result};

/// One entry and its stream sequence.
#[derive(Clone, Debug)]
pub struct Positioned {
    pub position: u64,
    pub entry: Entry,
}

/// What the service does with a batch: apply every entry in order and return once all of it is
/// committed and visible. Runs on a blocking thread. An error leaves the batch to be applied
/// again, so applying an entry twice must change nothing.
pub trait Applier: Send + Sync + 'static {
    fn apply(&self, batch: &[Positioned]) -> Result<()>;

    /// Drops everything applied from the log (every collection it made, and the aliases naming
    /// them), before a recovered log is applied from its start (see `recover`). Runs on a
    /// blocking thread.
    fn reset(&self) -> Result<()>;
}

/// The running loop and its watch; [`ApplyTask::stop`] ends them after the batch in hand.
pub struct ApplyTask {
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
    watch: tokio::task::JoinHandle<()>,
}

impl ApplyTask {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(error) = self.handle.await {
            tracing::error!(%error, "the log's apply loop failed");
        }
        let _ = self.watch.await;
    }
}

/// Why reading a batch did not give entries.
enum ReadFailure {
    /// Stop for good, with the reason (when the log is lost, logged where that was found).
    Malformed(String),
    /// Try again (NATS is unreachable, a part could not be fetched yet).
    Transient(LatheError),
    /// The watch found delivery stalled: read again at once.
    Stalled,
}

impl From<LatheError> for ReadFailure {
    /// A lost log or a stream that cannot be the log stops the loop; anything else is tried
    /// again.
    fn from(error: LatheError) -> Self {
        match error {
            LatheError::Precondition(reason) => Self::Malformed(reason),
            error => Self::Transient(error),
        }
    }
}

/// First and longest pause between attempts to apply a batch.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_LONGEST: Duration = Duration::from_secs(30);
/// Longest pause between attempts to read the log again: reading resumes within this of the
/// log answering again.
const REREAD_LONGEST: Duration = Duration::from_secs(2);
/// The longest a pull request of the consumer waits (its heartbeat is half of it): a request
/// lost while the log or this process was paused is noticed and made again within about this.
const PULL_EXPIRES: Duration = Duration::from_secs(4);

impl Replication {
    /// Starts the apply loop (see the module doc) with `applier`.
    pub fn start(self: &Arc<Self>, applier: Arc<dyn Applier>) -> ApplyTask {
        let (stop, stopped) = watch::channel(false);
        let replication = Arc::clone(self);
        let watch_stop = stopped.clone();
        let handle = tokio::spawn(async move { replication.run(applier, stopped).await });
        let replication = Arc::clone(self);
        let watch = tokio::spawn(async move { replication.watch(watch_stop).await });
        ApplyTask {
            stop,
            handle,
            watch,
        }
    }

    async fn run(self: Arc<Self>, applier: Arc<dyn Applier>, mut stop: watch::Receiver<bool>) {
        // The client connects in the background: give it a moment before the first read, so a
        // start does not begin with a failure (a flush returns once the connection is up).
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.flush()).await;
        let mut pause = RETRY_FIRST;
        let mut warned: Option<std::time::Instant> = None;
        loop {
            match self.follow(&applier, &mut stop).await {
                Ok(()) => return,
                // Reads go on; applying waits for an operator's recovery, then starts again.
                Err(ReadFailure::Malformed(_)) if self.state.progress().lost.is_some() => {
                    if !self.await_recovery(&applier, &mut stop).await {
                        return;
                    }
                    pause = RETRY_FIRST;
                    continue;
                }
                Err(ReadFailure::Malformed(reason)) => {
                    tracing::error!(url = self.url(), %reason, "the write log holds an entry this replica cannot apply; applying stopped, reads go on");
                    self.state.update(|p| p.stopped = Some(reason));
                    return;
                }
                Err(ReadFailure::Stalled) => {
                    pause = RETRY_FIRST;
                    continue;
                }
                Err(ReadFailure::Transient(error)) => {
                    // One line per half minute of an outage, not one per attempt.
                    if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
                        tracing::warn!(url = self.url(), %error, retry_ms = pause.as_millis() as u64, "following the write log failed; retrying");
                        warned = Some(std::time::Instant::now());
                    }
                }
            }
            if !pause_unless_stopped(pause, &mut stop).await {
                return;
            }
            pause = (pause * 2).min(REREAD_LONGEST);
        }
    }

    /// Opens the consumer after the recorded position and applies batches until told to stop
    /// (`Ok`) or until reading fails.
    async fn follow(
        &self,
        applier: &Arc<dyn Applier>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), ReadFailure> {
        let stream = self.stream().await?;
        let recorded = self.recorded_position(stream).await?;
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: self.subjects.log_filter(),
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: recorded.applied + 1,
                },
                max_expires: PULL_EXPIRES,
                ..Default::default()
            })
            .await
            .map_err(|e| ReadFailure::Transient(super::log_unavailable(self.url(), e)))?;
        let pending = consumer.cached_info().num_pending;
        tracing::info!(
            url = self.url(),
            from = recorded.applied + 1,
            pending,
            "reading the write log from its position"
        );
        if pending == 0 {
            self.state.update(|p| {
                p.applied = p.applied.max(recorded.applied);
                p.pending = 0;
                p.oldest_unapplied = None;
                p.known_at = Some(SystemTime::now());
                p.caught_up = true;
            });
        }
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| ReadFailure::Transient(super::log_unavailable(self.url(), e)))?;
        let mut recorded = recorded;
        loop {
            let first = tokio::select! {
                first = messages.next() => first,
                _ = stop.wait_for(|stop| *stop) => return Ok(()),
                () = self.kick.notified() => return Err(ReadFailure::Stalled),
            };
            let Some(first) = first else {
                return Err(ReadFailure::Transient(super::log_unavailable(
                    self.url(),
                    "the consumer ended",
                )));
            };
            let mut batch = vec![first];
            while batch.len() < self.config.apply_batch {
                match messages.next().now_or_never() {
                    Some(Some(message)) => batch.push(message),
                    _ => break,
                }
            }
            let mut read = self.read_batch(stream, batch).await?;
            // Nothing more is applied from a log found lost meanwhile.
            self.check_log()?;
            let entries = std::mem::take(&mut read.entries);
            self.applying.store(true, Ordering::Release);
            let applied = self.apply_with_retries(applier, entries, stop).await;
            self.applying.store(false, Ordering::Release);
            if !applied? {
                return Ok(());
            }
            recorded.applied = read.last;
            self.record(&recorded, &read)?;
        }
    }

    /// The recorded position, checked against the log as it is now (read afresh, not as this
    /// process first found it): a data dir applied from another log (the stream deleted and
    /// made again, or purged) must not be continued, and the log is then lost. Once checked,
    /// the log's identity is what the watch compares with.
    async fn recorded_position(
        &self,
        stream: &jetstream::stream::Stream,
    ) -> Result<ReplicaPosition, ReadFailure> {
        let recorded =
            position::load(&self.data_dir).map_err(|e| ReadFailure::Malformed(e.to_string()))?;
        let recorded_identity = recorded.as_ref().and_then(|recorded| {
            let incarnation = recorded.incarnation.clone()?;
            Some(LogIdentity {
                created_ns: recorded.stream_created_ns.clone(),
                incarnation,
            })
        });
        let (current, _head) = self
            .current_identity(stream, recorded_identity.as_ref())
            .await?;
        let position = match recorded {
            None => ReplicaPosition {
                stream: self.config.stream.clone(),
                stream_created_ns: current.created_ns.clone(),
                applied: 0,
                incarnation: Some(current.incarnation.clone()),
            },
            Some(recorded) => {
                // A file from before the incarnation was kept is checked by creation time.
                let was = LogIdentity {
                    created_ns: recorded.stream_created_ns.clone(),
                    incarnation: recorded
                        .incarnation
                        .clone()
                        .unwrap_or_else(|| current.incarnation.clone()),
                };
                if recorded.stream != self.config.stream {
                    return Err(self
                        .lose(format!(
                            "{} says this data dir was applied from stream `{}`, up to position {}; this replica is set to follow `{}` at {}: it is another log. Empty the data dir to bootstrap this replica from it",
                            position::path(&self.data_dir).display(),
                            recorded.stream,
                            recorded.applied,
                            self.config.stream,
                            self.url()
                        ))
                        .into());
                }
                self.same_log(&was, &current)?;
                self.state
                    .update(|p| p.applied = p.applied.max(recorded.applied));
                ReplicaPosition {
                    incarnation: Some(current.incarnation.clone()),
                    ..recorded
                }
            }
        };
        *self.identity.lock().unwrap_or_else(|p| p.into_inner()) = Some(current);
        Ok(position)
    }

    /// Applies a batch, retrying (with backoff, reported in the progress) until it goes through
    /// (`true`) or the loop is told to stop (`false`). A batch being applied is always finished:
    /// the blocking apply is awaited, never abandoned. A batch refused for a reason retrying
    /// cannot change (FAILED_PRECONDITION: replicas running different models) stops the loop.
    async fn apply_with_retries(
        &self,
        applier: &Arc<dyn Applier>,
        entries: Vec<Positioned>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, ReadFailure> {
        let (first, last) = (
            entries.first().map_or(0, |e| e.position),
            entries.last().map_or(0, |e| e.position),
        );
        let entries = Arc::new(entries);
        let mut pause = RETRY_FIRST;
        loop {
            let batch = Arc::clone(&entries);
            let applier = Arc::clone(applier);
            let applied = tokio::task::spawn_blocking(move || applier.apply(&batch))
                .await
                .unwrap_or_else(|e| Err(LatheError::internal(format!("applying a batch: {e}"))));
            let error = match applied {
                Ok(()) => return Ok(true),
                Err(LatheError::Precondition(reason)) => {
                    return Err(ReadFailure::Malformed(reason))
                }
                Err(error) => error,
            };
            tracing::error!(%error, first, last, retry_ms = pause.as_millis() as u64, "applying log entries failed; retrying");
            self.state
                .update(|p| p.retrying = Some(format!("entries {first}..={last}: {error}")));
            if !pause_unless_stopped(pause, stop).await {
                return Ok(false);
            }
            pause = (pause * 2).min(RETRY_LONGEST);
        }
    }

    fn record(&self, recorded: &ReplicaPosition, read: &ReadBatch) -> Result<(), ReadFailure> {
        position::store(&self.data_dir, recorded).map_err(ReadFailure::Transient)?;
        self.state.update(|p| {
            p.applied = read.last;
            p.pending = read.pending;
            p.applied_published = read.published;
            p.retrying = None;
            if read.pending == 0 {
                p.caught_up = true;
            }
            // The pending count of a delivered entry is not the log's (a consumer made again
            // after a stall counts from where it starts), so only the watch clears the oldest
            // unapplied entry; applying moves it on: whatever waits was stored after this batch.
            if let (Some(oldest), Some(published)) = (p.oldest_unapplied, read.published) {
                p.oldest_unapplied = Some(oldest.max(published));
            }
        });
        Ok(())
    }

    /// Decodes a batch of messages, resolving split versions.
    async fn read_batch(
        &self,
        stream: &jetstream::stream::Stream,
        messages: Vec<Result<jetstream::Message, impl std::fmt::Display>>,
    ) -> Result<ReadBatch, ReadFailure> {
        let mut read = ReadBatch::default();
        for message in messages {
            let message = message.map_err(|e| {
                ReadFailure::Transient(super::log_unavailable(self.url(), e.to_string()))
            })?;
            let info = message.info().map_err(|e| {
                ReadFailure::Transient(super::log_unavailable(self.url(), e.to_string()))
            })?;
            let (position, pending) = (info.stream_sequence, info.pending);
            let published: SystemTime = info.published.into();
            let at =
                |why: String| format!("entry {position} ({}): {why}", message.subject.as_str());
            let decoded = codec::decode(&message.payload)
                .map_err(|Malformed(why)| ReadFailure::Malformed(at(why)))?;
            let entry = match decoded {
                Decoded::Entry(entry) => Some(entry),
                Decoded::Parts(parts) => self.assemble(stream, position, parts).await.map_err(
                    |failure| match failure {
                        ReadFailure::Malformed(why) => ReadFailure::Malformed(at(why)),
                        transient => transient,
                    },
                )?,
            };
            if let Some(entry) = entry {
                read.entries.push(Positioned { position, entry });
            }
            read.last = position;
            read.pending = pending;
            read.published = Some(published);
        }
        Ok(read)
    }

    /// The version a parts entry names: every part read, the whole checked against its hash
    /// and decoded. `None` when a part is gone because a newer version of the document was
    /// stored after this entry (its publisher purged the older parts).
    async fn assemble(
        &self,
        stream: &jetstream::stream::Stream,
        position: u64,
        parts: PartsRef,
    ) -> Result<Option<Entry>, ReadFailure> {
        let mut bytes = Vec::with_capacity(parts.total_bytes.min(1 << 30) as usize);
        let prefix = self
            .subjects
            .parts_of_document(&parts.collection, &parts.doc_id)
            .trim_end_matches('>')
            .to_string();
        for &sequence in &parts.sequences {
            match stream.get_raw_message(sequence).await {
                Ok(part) if part.subject.as_str().starts_with(&prefix) => {
                    bytes.extend_from_slice(&part.payload)
                }
                Ok(part) => {
                    return Err(ReadFailure::Malformed(format!(
                        "part {sequence} is a message of {}, not of this document",
                        part.subject.as_str()
                    )))
                }
                Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                    return self.superseded(stream, position, &parts, sequence).await
                }
                Err(e) => {
                    return Err(ReadFailure::Transient(super::log_unavailable(
                        self.url(),
                        e,
                    )))
                }
            }
        }
        if bytes.len() as u64 != parts.total_bytes
            || *blake3::hash(&bytes).as_bytes() != parts.blake3
        {
            return Err(ReadFailure::Malformed(format!(
                "its {} parts hold {} bytes that do not match the {} bytes and hash it names",
                parts.sequences.len(),
                bytes.len(),
                parts.total_bytes
            )));
        }
        match codec::decode(&bytes) {
            Ok(Decoded::Entry(entry @ Entry::Upsert { .. }))
                if entry.collection() == parts.collection =>
            {
                Ok(Some(entry))
            }
            Ok(_) => Err(ReadFailure::Malformed(
                "its parts do not hold a version of its document".into(),
            )),
            Err(Malformed(why)) => Err(ReadFailure::Malformed(format!("its parts: {why}"))),
        }
    }

    /// A missing part is expected only when the document has a newer entry; otherwise the log
    /// lost data this replica needs.
    async fn superseded(
        &self,
        stream: &jetstream::stream::Stream,
        position: u64,
        parts: &PartsRef,
        missing: u64,
    ) -> Result<Option<Entry>, ReadFailure> {
        let subject = self.subjects.document(&parts.collection, &parts.doc_id);
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(latest) if latest.sequence > position => {
                tracing::debug!(position, newer = latest.sequence, "split version superseded before it was read");
                Ok(None)
            }
            Ok(_) => Err(ReadFailure::Malformed(format!(
                "part {missing} of document `{}` is missing from the stream and no newer version replaces it",
                parts.doc_id
            ))),
            Err(e) => Err(ReadFailure::Transient(super::log_unavailable(self.url(), e))),
        }
    }
}

/// Sleeps `pause`; `false` when told to stop meanwhile.
pub(super) async fn pause_unless_stopped(
    pause: Duration,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => true,
        _ = stop.wait_for(|stop| *stop) => false,
    }
}

/// A decoded batch: the entries to apply and where the batch ends.
#[derive(Default)]
struct ReadBatch {
    entries: Vec<Positioned>,
    /// Stream sequence of the batch's last message (passed-over ones included).
    last: u64,
    /// Entries the log held after it.
    pending: u64,
    /// When its last message was published.
    published: Option<SystemTime>,
}
