//! The work queue of a replicated deployment: writes acknowledged before they are embedded.
//!
//! A write without `wait` is checked and cut into sections by the replica that takes it, then
//! published, as it stands, to a JetStream stream of its own beside the log (`<stream>_WORK`,
//! work-queue retention, subjects `<prefix>.work.>`): once JetStream has stored it, it is
//! acknowledged. Every replica runs an index worker on one shared durable consumer of that
//! stream, so any replica takes the next write, embeds it and publishes its versions to the log
//! as a direct write would; only then is the work message acknowledged, and JetStream removes it.
//! A worker that dies mid-write leaves it unacknowledged: it is delivered again, to any worker.
//!
//! **Order.** Workers run side by side, so an older write of a document may finish after a newer
//! one. Every write therefore carries a [`Stamp`], the work stream's sequence of its queued
//! message (a direct write takes one by storing and deleting a claim message), and every version
//! it publishes carries the stamp in a header. A stamped version is published only over an entry
//! with a lower stamp, conditionally on the document's last sequence (JetStream refuses it if
//! another version was stored meanwhile, and it is read again): a write that lost the race to a
//! newer one publishes nothing for that document. So the log always keeps the newest write of
//! every document, whichever worker finishes last.
//!
//! **Collections and logs.** A work message names the collection's incarnation and the log (its
//! incarnation id) it was accepted under. A worker drops a write whose collection is gone, or
//! made again, in the same log; after a recovery (another log) it applies the write to the
//! collection of its name in the recovered log, once it has applied that log so far.
//!
//! **Tokens.** A queued write's consistency token is [`WORK_TOKEN`] + its work sequence. A read
//! carrying one waits until the work stream holds no message up to that sequence (every write
//! queued until then was published to the log), then until this replica has applied the log as
//! far as it went at that moment.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::consumer::AckPolicy;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, RawMessageErrorKind};
use async_nats::jetstream::AckKind;
use bytes::Bytes;
use futures::StreamExt;

use super::publish::PublishFailure;
use super::state::WorkDepth;
use super::{log_unavailable, Replication};
use crate::error::{LatheError, Result};

/// Tokens at or above this are work tokens (see the module doc); log positions stay below it.
pub const WORK_TOKEN: u64 = 1 << 62;

/// The header holding a version's [`Stamp`].
pub(super) const STAMP_HEADER: &str = "Lathe-Stamp";

/// The header of a work message naming the collection's incarnation it was accepted for.
const INCARNATION_HEADER: &str = "Lathe-Incarnation";

/// The header of a work message naming the log it was accepted under (its incarnation id).
const LOG_HEADER: &str = "Lathe-Log";

/// The durable consumer every replica's index worker pulls from.
const WORKERS: &str = "lathe-index-workers";

/// How long a worker may hold a write without a word before JetStream delivers it again; a
/// worker tells it "in progress" every third of it while it embeds.
pub const WORK_ACK_WAIT: Duration = Duration::from_secs(15);

/// How long one pull for the next write waits.
const PULL_WAIT: Duration = Duration::from_secs(2);

/// Publications of one stamped version retried after another version was stored meanwhile.
const STAMPED_ATTEMPTS: usize = 8;

/// The retry delay a write refused past the work stream's bound is given.
const QUEUE_FULL_RETRY: Duration = Duration::from_secs(5);

/// How often a read waiting for a work token looks at the work stream again.
const WORK_POLL: Duration = Duration::from_millis(50);

/// The order of writes: the work stream's creation time (a stream made again starts its
/// sequences over, and its writes must still win over older ones), then its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    epoch: u64,
    sequence: u64,
}

impl Stamp {
    pub(super) fn header(self) -> String {
        format!("{}.{}", self.epoch, self.sequence)
    }

    /// The stamp a header holds; `None` for a version published unstamped (before the work
    /// queue, or by a re-seed), which any stamped write replaces.
    pub(super) fn of(headers: &async_nats::HeaderMap) -> Option<Self> {
        let value = headers.get(STAMP_HEADER)?.as_str();
        let (epoch, sequence) = value.split_once('.')?;
        Some(Self {
            epoch: epoch.parse().ok()?,
            sequence: sequence.parse().ok()?,
        })
    }
}

/// A queued write, taken by this replica's worker: acknowledge it once its versions are in the
/// log ([`WorkItem::done`]), or leave it for another try ([`WorkItem::retry_later`]).
pub struct WorkItem {
    pub collection: String,
    /// The collection's incarnation (log position of its creation) the write was accepted for.
    pub incarnation: u64,
    /// The log it was accepted under (its incarnation id), when known then.
    pub log: Option<String>,
    pub stamp: Stamp,
    pub payload: Bytes,
    /// How many times JetStream delivered it (1 the first time).
    pub delivered: i64,
    message: jetstream::Message,
}

impl WorkItem {
    /// Tells JetStream the write is still being worked on (it is not delivered again meanwhile).
    pub async fn in_progress(&self) {
        let _ = self.message.ack_with(AckKind::Progress).await;
    }

    /// The write's versions are in the log: JetStream removes it from the queue.
    pub async fn done(&self) -> Result<()> {
        self.message
            .double_ack()
            .await
            .map_err(|e| LatheError::Unavailable(format!("acknowledging a queued write: {e}")))
    }

    /// Delivered again after `delay`, to any worker.
    pub async fn retry_later(&self, delay: Duration) {
        let _ = self.message.ack_with(AckKind::Nak(Some(delay))).await;
    }

    /// Never delivered again (it cannot be applied: see the caller's log line).
    pub async fn drop_it(&self) {
        let _ = self.message.ack_with(AckKind::Term).await;
    }
}

/// The index workers' consumer, as this replica pulls from it.
pub struct WorkConsumer {
    consumer: jetstream::consumer::Consumer<pull::Config>,
    collection_of: String,
}

impl Replication {
    /// The work stream, created on first use.
    async fn work_stream(&self) -> Result<&jetstream::stream::Stream> {
        self.check_connected()?;
        self.work
            .get_or_try_init(|| async {
                let wanted = jetstream::stream::Config {
                    name: format!("{}_WORK", self.config.stream),
                    subjects: self.subjects.work_stream_subjects(),
                    retention: jetstream::stream::RetentionPolicy::WorkQueue,
                    storage: jetstream::stream::StorageType::File,
                    num_replicas: self.config.stream_replicas,
                    duplicate_window: self.dedupe_window,
                    ..Default::default()
                };
                self.jetstream
                    .get_or_create_stream(wanted.clone())
                    .await
                    .map_err(|e| super::stream_error(self.url(), &wanted.name, e))
            })
            .await
    }

    async fn stamp_of(&self, sequence: u64) -> Result<Stamp> {
        let created = self.work_stream().await?.cached_info().created;
        Ok(Stamp {
            epoch: u64::try_from(created.unix_timestamp_nanos()).unwrap_or(0),
            sequence,
        })
    }

    /// Queues a write (its pieces, each one message, already encoded) for the index workers;
    /// answers its token once JetStream stored every piece. With a `write_id`, each piece carries
    /// a message id derived from it: the same write sent again within the dedupe window is
    /// stored once, and answers the first one's token.
    /// Past `limit` bytes queued in all (`ingest.max_queued_bytes_total`; 0: none), the write
    /// is refused whole with [`LatheError::QueueFull`] and nothing is stored.
    pub async fn queue_write(
        &self,
        collection: &str,
        incarnation: u64,
        pieces: Vec<Vec<u8>>,
        write_id: &str,
        limit: u64,
    ) -> Result<u64> {
        self.check_log()?;
        let work = self.work_stream().await?;
        if limit > 0 {
            let bytes = pieces.iter().map(|piece| piece.len() as u64).sum::<u64>();
            let queued = work
                .get_info()
                .await
                .map_err(|e| log_unavailable(self.url(), e))?
                .state
                .bytes;
            if queued + bytes > limit {
                return Err(LatheError::QueueFull {
                    scope: format!("the work stream `{}`", work.cached_info().config.name),
                    queued,
                    bytes,
                    limit,
                    field: "max_queued_bytes_total",
                    retry_after: QUEUE_FULL_RETRY,
                });
            }
        }
        let (total, mut last) = (pieces.len(), 0);
        for (k, piece) in pieces.into_iter().enumerate() {
            let mut message = PublishMessage::build()
                .payload(piece.into())
                .header(INCARNATION_HEADER, incarnation.to_string());
            if let Some(log) = self.log_incarnation() {
                message = message.header(LOG_HEADER, log);
            }
            let id = super::publish::message_id(collection, write_id, &format!("work-{k}"), "");
            let sent = self
                .send(self.subjects.work(collection), with_id(message, id))
                .await
                .map_err(PublishFailure::into_error);
            match sent {
                Ok((sequence, _)) => last = last.max(sequence),
                Err(LatheError::LogUnavailable { url, cause, .. }) if k > 0 => {
                    return Err(LatheError::LogUnavailable {
                        url,
                        cause,
                        stored: Some(format!(
                            "{k} of the write's {total} messages were queued and will be applied; send it again (with the same write_id, only the rest is stored)"
                        )),
                    })
                }
                Err(error) => return Err(error),
            }
        }
        Ok(WORK_TOKEN + last)
    }

    /// A stamp for a write published directly (not queued), later than every write queued so
    /// far: a claim message is stored on a subject no worker takes, and deleted at once.
    pub async fn claim_stamp(&self) -> Result<Stamp> {
        let stream = self.work_stream().await?;
        let message = PublishMessage::build().payload(Bytes::new());
        let (sequence, _) = self
            .send(self.subjects.work_claim(), message)
            .await
            .map_err(PublishFailure::into_error)?;
        if let Err(error) = stream.delete_message(sequence).await {
            tracing::debug!(sequence, %error, "deleting a claim message failed; it stays, unread");
        }
        self.stamp_of(sequence).await
    }

    /// This replica's handle on the index workers' consumer (made by the first replica).
    pub async fn work_consumer(&self) -> Result<WorkConsumer> {
        let stream = self.work_stream().await?;
        let consumer = stream
            .get_or_create_consumer(
                WORKERS,
                pull::Config {
                    durable_name: Some(WORKERS.to_string()),
                    filter_subject: self.subjects.work_filter(),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: WORK_ACK_WAIT,
                    max_ack_pending: 1024,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| log_unavailable(self.url(), e))?;
        Ok(WorkConsumer {
            consumer,
            collection_of: self.subjects.work(""),
        })
    }

    /// The next queued write, waiting a few seconds for one; `None` when none came.
    pub async fn next_work(&self, consumer: &WorkConsumer) -> Result<Option<WorkItem>> {
        self.check_connected()?;
        let mut batch = consumer
            .consumer
            .batch()
            .max_messages(1)
            .expires(PULL_WAIT)
            .messages()
            .await
            .map_err(|e| log_unavailable(self.url(), e))?;
        let Some(message) = batch.next().await else {
            return Ok(None);
        };
        let message = message.map_err(|e| log_unavailable(self.url(), e))?;
        let info = message.info().map_err(|e| log_unavailable(self.url(), e))?;
        let (sequence, delivered) = (info.stream_sequence, info.delivered);
        let collection = message
            .subject
            .as_str()
            .strip_prefix(&consumer.collection_of)
            .unwrap_or_default()
            .to_string();
        let header = |name: &str| {
            let headers = message.headers.as_ref()?;
            Some(headers.get(name)?.as_str().to_string())
        };
        let incarnation = header(INCARNATION_HEADER)
            .and_then(|value| value.parse().ok())
            .unwrap_or(0);
        let log = header(LOG_HEADER);
        Ok(Some(WorkItem {
            collection,
            incarnation,
            log,
            stamp: self.stamp_of(sequence).await?,
            payload: message.payload.clone(),
            delivered,
            message,
        }))
    }

    /// The incarnation id of the log this replica follows, once its apply loop has checked it.
    pub fn log_incarnation(&self) -> Option<String> {
        let identity = self.identity.lock().unwrap_or_else(|p| p.into_inner());
        identity
            .as_ref()
            .map(|identity| identity.incarnation.clone())
    }

    /// Reads the work stream's depth into the replica's progress (its metrics), once the
    /// stream has been reached.
    pub(super) async fn look_at_work(&self) {
        let Some(work) = self.work.get() else {
            return;
        };
        let Ok(info) = work.get_info().await else {
            return;
        };
        let depth = WorkDepth {
            messages: info.state.messages,
            bytes: info.state.bytes,
            oldest: (info.state.messages > 0).then(|| info.state.first_timestamp.into()),
        };
        self.state.update(|progress| progress.work = depth);
    }

    /// Waits until the write of work token `token` (and every write queued before it) is
    /// published to the log and applied here. The caller's deadline bounds the wait.
    pub async fn wait_work_applied(&self, token: u64) -> Result<()> {
        let sequence = token - WORK_TOKEN;
        let work = self.work_stream().await?;
        loop {
            let oldest = work
                .raw_message_builder()
                .sequence(1)
                .next_by_subject(self.subjects.work_filter())
                .send()
                .await;
            match oldest {
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(e) => return Err(log_unavailable(self.url(), e)),
                Ok(message) if message.sequence > sequence => break,
                Ok(_) => tokio::time::sleep(WORK_POLL).await,
            }
        }
        self.wait_head_applied().await
    }

    /// Waits until this replica has applied the log as far as its last entry now.
    pub async fn wait_head_applied(&self) -> Result<()> {
        let stream = self.stream().await?;
        let head = match stream
            .get_last_raw_message_by_subject(&self.subjects.log_filter())
            .await
        {
            Ok(message) => message.sequence,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => 0,
            Err(e) => return Err(log_unavailable(self.url(), e)),
        };
        self.state.wait_applied(head).await
    }
}

impl Replication {
    /// Publishes one version stamped `stamp` (see `work`): only over a version with a lower
    /// stamp, or none, and only if none was stored meanwhile. A newer write's version found there
    /// is left as it is, and its position answered.
    pub(super) async fn publish_stamped(
        &self,
        stream: &jetstream::stream::Stream,
        subject: String,
        payload: bytes::Bytes,
        stamp: Stamp,
        id: Option<String>,
    ) -> Result<u64> {
        for _ in 0..STAMPED_ATTEMPTS {
            let (last, last_stamp) = self.last_version(stream, &subject).await?;
            if last_stamp >= Some(stamp) {
                return Ok(last);
            }
            let message = PublishMessage::build()
                .payload(payload.clone())
                .header(STAMP_HEADER, stamp.header())
                .expected_last_subject_sequence(last);
            match self
                .send(subject.clone(), with_id(message, id.clone()))
                .await
            {
                Ok((position, _)) => return Ok(position),
                Err(PublishFailure::Raced) => continue,
                Err(PublishFailure::Other(error)) => return Err(error),
            }
        }
        Err(LatheError::Unavailable(format!(
            "`{subject}` was written by others {STAMPED_ATTEMPTS} times while this version was being published; resend it"
        )))
    }

    /// The last sequence of `subject` (0 when it holds nothing) and the stamp of its version.
    pub(super) async fn last_version(
        &self,
        stream: &jetstream::stream::Stream,
        subject: &str,
    ) -> Result<(u64, Option<Stamp>)> {
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok((message.sequence, Stamp::of(&message.headers))),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok((0, None)),
            Err(e) => Err(log_unavailable(self.url(), e)),
        }
    }
}

fn with_id(message: PublishMessage, id: Option<String>) -> PublishMessage {
    match id {
        Some(id) => message.message_id(id),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_order_by_the_stream_made_then_the_sequence_and_round_trip_through_a_header() {
        let old = Stamp {
            epoch: 5,
            sequence: 900,
        };
        let newer = Stamp {
            epoch: 5,
            sequence: 901,
        };
        let remade = Stamp {
            epoch: 6,
            sequence: 1,
        };
        assert!(old < newer && newer < remade);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(STAMP_HEADER, remade.header().as_str());
        assert_eq!(Stamp::of(&headers), Some(remade));
        assert_eq!(Stamp::of(&async_nats::HeaderMap::new()), None);
        headers.insert(STAMP_HEADER, "not.a-stamp");
        assert_eq!(Stamp::of(&headers), None);
    }
}
