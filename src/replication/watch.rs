//! The log read on a timer (`replication.watch_interval_ms`), independent of delivery:
//!
//! - **Lag from the log.** The stream's head and the oldest log entry after the applied
//!   position (a direct get) give the replica's lag as the age of the oldest entry it has not
//!   applied, and readiness follows it whatever the consumer is doing.
//! - **A stalled delivery is restarted.** Entries waiting, the applied position unmoved since
//!   the last look, the apply loop idle: the loop reads the log again from its position (the
//!   consumer's own heartbeats notice most stalls first; this bounds the rest).
//! - **The log's identity.** A log is its stream's creation time and its incarnation: one
//!   message (subject `<prefix>.part.$log.incarnation`) the first replica to find the stream
//!   without it writes, conditionally, so that exactly one is ever written. Each replica
//!   records both with its position. A stream deleted, purged (the incarnation is gone) or made
//!   again (another creation time, another incarnation) is another log: the replica stops
//!   applying, is not ready, and refuses writes, with one ERROR naming the cause, until an
//!   operator decides (README, "Replicas"). A replica whose data dir holds data of a log never
//!   makes the stream itself. A recovery (`recover`) writes a new incarnation naming those it
//!   supersedes; a log whose recovery is still filling it is not followed yet.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use async_nats::jetstream;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind};
use tokio::sync::watch;

use super::recover::Incarnation;
use super::{log_unavailable, Replication};
use crate::error::{LatheError, Result};

/// Which log a replica's data came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogIdentity {
    /// The stream's creation time, nanoseconds since the epoch.
    pub created_ns: String,
    pub incarnation: String,
}

impl Replication {
    /// FAILED_PRECONDITION once the log is lost: nothing more is published.
    pub(super) fn check_log(&self) -> Result<()> {
        match self.state.progress().lost {
            None => Ok(()),
            Some(lost) => Err(LatheError::Precondition(format!(
                "{lost}; this replica stopped applying and takes no writes (nothing was stored) until an operator recovers the log: `lathe replicas reseed` (a new log from one replica's data) or `lathe replicas start-over` (README, \"Replicas\")"
            ))),
        }
    }

    /// At start, when the log answers within `wait`: a stream that can never be the log (its
    /// subjects overlap another stream's, or it exists with other settings) stops the start
    /// with the reason. A log out of reach, or lost, does not: reads are served meanwhile.
    pub async fn check_at_start(&self, wait: Duration) -> Result<()> {
        let _ = tokio::time::timeout(wait, self.client.flush()).await;
        match tokio::time::timeout(wait, self.stream()).await {
            Ok(Err(LatheError::Precondition(reason))) if self.state.progress().lost.is_none() => {
                Err(LatheError::invalid("replication.stream", reason))
            }
            _ => Ok(()),
        }
    }

    /// Marks the log lost (once: one ERROR line) and returns the error writes get.
    pub(super) fn lose(&self, reason: String) -> LatheError {
        let mut first = false;
        self.state.update(|progress| {
            if progress.lost.is_none() {
                progress.lost = Some(reason.clone());
                first = true;
            }
        });
        if first {
            tracing::error!(url = self.url(), stream = self.config.stream, %reason, "the write log this replica follows is lost; applying stopped, writes are refused, health is NOT_SERVING");
            // The apply loop may be waiting for an entry the lost log will never deliver: it
            // stops reading, and waits for an operator's recovery instead.
            self.kick.notify_one();
        }
        self.check_log()
            .err()
            .unwrap_or(LatheError::Precondition(reason))
    }

    /// The stream, which must exist: this data dir was applied from it.
    pub(super) async fn open_existing_stream(&self) -> Result<jetstream::stream::Stream> {
        match self.jetstream.get_stream(&self.config.stream).await {
            Ok(stream) => Ok(stream),
            Err(error) if stream_not_found(error.kind()) => Err(self.gone()),
            Err(error) => Err(log_unavailable(self.url(), error)),
        }
    }

    fn gone(&self) -> LatheError {
        self.lose(format!(
            "the stream `{}` at {} no longer exists (deleted, or nats-server started on an empty store) while this replica holds data applied from it up to position {}",
            self.config.stream,
            self.url(),
            self.state.progress().applied
        ))
    }

    /// The log `stream` is now, and its head (the last sequence): its incarnation is written
    /// when it has none and `recorded` (the log this data dir was applied from) is none either;
    /// a log of this data dir that lost its incarnation was purged. Checked against `recorded`
    /// by the caller ([`Self::same_log`]).
    pub(super) async fn current_identity(
        &self,
        stream: &jetstream::stream::Stream,
        recorded: Option<&LogIdentity>,
    ) -> Result<(LogIdentity, u64)> {
        let info = match self.jetstream.get_stream(&self.config.stream).await {
            Ok(fresh) => fresh.cached_info().clone(),
            Err(error) if stream_not_found(error.kind()) => return Err(self.gone()),
            Err(error) => return Err(log_unavailable(self.url(), error)),
        };
        let created_ns = info.created.unix_timestamp_nanos().to_string();
        let incarnation = match self.incarnation(stream).await? {
            // A recovery still filling the new log (see `recover`): not a log to follow yet.
            Some(record) if !record.complete => {
                return Err(log_unavailable(
                    self.url(),
                    format!("the log is being recovered ({}); it is followed once that is done", record.origin),
                ))
            }
            Some(record) => record.id,
            // Never written into a log this replica's data did not come from.
            None => match recorded {
                Some(recorded) if recorded.created_ns == created_ns => {
                    return Err(self.lose(format!(
                        "the stream `{}` at {} was purged: its incarnation entry is gone, and with it entries this replica's data came from",
                        self.config.stream,
                        self.url()
                    )))
                }
                Some(recorded) => {
                    let current = LogIdentity {
                        created_ns,
                        incarnation: "none".into(),
                    };
                    return Err(self
                        .same_log(recorded, &current)
                        .err()
                        .unwrap_or_else(|| self.gone()));
                }
                None => self.write_incarnation(stream).await?,
            },
        };
        let identity = LogIdentity {
            created_ns,
            incarnation,
        };
        Ok((identity, info.state.last_sequence))
    }

    /// Checks `current` against the log this replica's data came from; `Err` (lost) when it is
    /// another.
    pub(super) fn same_log(&self, recorded: &LogIdentity, current: &LogIdentity) -> Result<()> {
        if recorded.created_ns != current.created_ns {
            return Err(self.lose(format!(
                "the stream `{}` at {} was made again (created at {} ns; this replica's data came from the one created at {} ns): it was deleted, or nats-server started on an empty store",
                self.config.stream,
                self.url(),
                current.created_ns,
                recorded.created_ns
            )));
        }
        if recorded.incarnation != current.incarnation {
            return Err(self.lose(format!(
                "the stream `{}` at {} was purged and written again: its incarnation is {}, this replica's data came from {}",
                self.config.stream,
                self.url(),
                current.incarnation,
                recorded.incarnation
            )));
        }
        Ok(())
    }

    /// The log's incarnation entry, when it has one.
    pub(super) async fn incarnation(
        &self,
        stream: &jetstream::stream::Stream,
    ) -> Result<Option<Incarnation>> {
        match stream
            .get_last_raw_message_by_subject(&self.subjects.incarnation())
            .await
        {
            Ok(message) => Ok(Some(Incarnation::parse(&message.payload))),
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(error) => Err(log_unavailable(self.url(), error)),
        }
    }

    /// Publishes `payload` as the log's incarnation entry; with `expected`, only if the
    /// subject's last entry is at that sequence (0: it has none).
    pub(super) async fn publish_incarnation(
        &self,
        payload: Vec<u8>,
        expected: Option<u64>,
    ) -> std::result::Result<jetstream::publish::PublishAck, jetstream::context::PublishError> {
        let mut message = PublishMessage::build().payload(payload.into());
        if let Some(expected) = expected {
            message = message.expected_last_subject_sequence(expected);
        }
        self.jetstream
            .send_publish(self.subjects.incarnation(), message)
            .await?
            .await
    }

    /// Writes the incarnation if there is none yet (only the first of racing replicas does)
    /// and returns the one the stream holds.
    async fn write_incarnation(&self, stream: &jetstream::stream::Stream) -> Result<String> {
        let id = format!("{:032x}", rand::random::<u128>());
        match self
            .publish_incarnation(id.clone().into_bytes(), Some(0))
            .await
        {
            Ok(_) => {
                tracing::info!(
                    url = self.url(),
                    stream = self.config.stream,
                    incarnation = id,
                    "wrote the log's incarnation"
                );
                Ok(id)
            }
            Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => self
                .incarnation(stream)
                .await?
                .map(|record| record.id)
                .ok_or_else(|| log_unavailable(self.url(), "the log's incarnation vanished")),
            Err(error) => Err(log_unavailable(self.url(), error)),
        }
    }

    /// The watch (see the module doc), until `stop`.
    pub(super) async fn watch(&self, mut stop: watch::Receiver<bool>) {
        let interval = Duration::from_millis(self.config.watch_interval_ms);
        let mut applied_before = None;
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
            let progress = self.state.progress();
            if progress.stopped.is_some() {
                return;
            }
            // Nothing to measure against a lost log; looked at again once a recovery is adopted.
            if progress.lost.is_some() {
                applied_before = None;
                continue;
            }
            if self.check_connected().is_ok() {
                // Bounded, so that a log that stops answering cannot hold the watch up.
                let _ = tokio::time::timeout(interval, self.look(applied_before)).await;
                let _ = tokio::time::timeout(interval, self.look_at_work()).await;
            }
            applied_before = Some(progress.applied);
        }
    }

    /// One look at the log, once the apply loop has checked which log it follows.
    async fn look(&self, applied_before: Option<u64>) {
        let Some(known) = self
            .identity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return;
        };
        let Ok(stream) = self.stream().await else {
            return;
        };
        let looked_at = SystemTime::now();
        let Ok((current, head)) = self.current_identity(stream, Some(&known)).await else {
            return;
        };
        if self.same_log(&known, &current).is_err() {
            return;
        }
        let applied = self.state.progress().applied;
        let next = stream
            .direct_get_next_for_subject(self.subjects.log_filter(), Some(applied + 1))
            .await;
        let oldest_unapplied = match next {
            Ok(message) => Some((message.sequence, SystemTime::from(message.time))),
            Err(error) if error.kind() == DirectGetErrorKind::NotFound => None,
            Err(_) => return,
        };
        self.state.update(|p| {
            // Applied on meanwhile: this look is already out of date.
            if p.applied != applied {
                return;
            }
            p.known_at = Some(looked_at);
            p.oldest_unapplied = oldest_unapplied.map(|(_, stored)| stored);
            p.pending = oldest_unapplied.map_or(0, |(sequence, _)| head.max(sequence) - applied);
            if oldest_unapplied.is_none() {
                p.caught_up = true;
            }
        });
        if let Some((sequence, stored)) = oldest_unapplied {
            let waited = looked_at.duration_since(stored).unwrap_or_default();
            let idle = !self.applying.load(Ordering::Acquire);
            if applied_before == Some(applied) && idle && waited > self.stall_after() {
                tracing::warn!(url = self.url(), applied, waiting = sequence, waited_ms = waited.as_millis() as u64, "the log's delivery stalled with entries waiting; reading it again from this replica's position");
                self.kick.notify_one();
            }
        }
    }

    /// How long an entry may wait, unapplied while the apply loop is idle, before its delivery
    /// counts as stalled.
    fn stall_after(&self) -> Duration {
        Duration::from_millis(self.config.watch_interval_ms).max(Duration::from_secs(1))
    }
}

fn stream_not_found(kind: GetStreamErrorKind) -> bool {
    matches!(kind, GetStreamErrorKind::JetStream(error) if error.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}
