//! Writing to the log. A write is acknowledged once JetStream has stored it; the position it
//! returns is the stream sequence of its last entry (the write's consistency token).
//!
//! A document version larger than one message is published as parts on subjects of their own,
//! then a `DocumentParts` entry on the document's subject names them by sequence. That entry is
//! published with `Nats-Expected-Last-Subject-Sequence` set to the document's last sequence read
//! before the parts were sent: if another version was stored meanwhile, it is refused and the
//! whole publication is made again, so a stored parts entry never names parts that a later
//! publication purged. Once it is stored, every part of the document older than its own first
//! part (earlier versions', and parts of publications that never got their entry stored) is
//! purged; a tombstone purges them all. Parts of a split version replaced by an inline one stay
//! until the document is next written split, deleted, or its collection deleted. A write sent
//! again with its `write_id` stores nothing: its parts carry message ids derived from it, so
//! JetStream answers the first publication's parts and entry (see `publish_parts`). A write
//! given a stamp (see `work`) publishes a version only over an older write's.

use async_nats::jetstream;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::future::join_all;

use super::codec::{self, Decoded, EncodedDocument, Entry, PartsRef};
use super::work::{Stamp, STAMP_HEADER};
use super::{log_unavailable, Replication};
use crate::error::{LatheError, Result};

/// Publications of one split version retried after another version won the race.
const SPLIT_ATTEMPTS: usize = 4;

impl Replication {
    /// Publishes one version per document (encoded `Entry::Upsert`s); returns the position of
    /// the last. Entries are sent together and their acknowledgements awaited together. On a
    /// failure the error says which documents the log stored: upserts are idempotent, so the
    /// caller resends the batch.
    pub async fn publish_documents(
        &self,
        collection: &str,
        documents: Vec<EncodedDocument>,
        write_id: &str,
        stamp: Option<Stamp>,
    ) -> Result<u64> {
        let stream = self.stream().await?;
        self.publish_documents_to(stream, collection, documents, write_id, stamp)
            .await
    }

    /// [`Self::publish_documents`] into `stream`, whatever this replica's state (a recovery
    /// seeds a new log with it while the old one is lost).
    pub(super) async fn publish_documents_to(
        &self,
        stream: &jetstream::stream::Stream,
        collection: &str,
        documents: Vec<EncodedDocument>,
        write_id: &str,
        stamp: Option<Stamp>,
    ) -> Result<u64> {
        let max = self.max_message_bytes();
        let ids: Vec<String> = documents.iter().map(|d| d.doc_id.clone()).collect();
        let publications = documents.into_iter().map(|document| async move {
            let subject = self.subjects.document(collection, &document.doc_id);
            let id = message_id(collection, write_id, "upsert", &document.doc_id);
            if document.bytes.len() > max {
                self.publish_split(stream, collection, document, max, id, stamp)
                    .await
            } else if let Some(stamp) = stamp {
                self.publish_stamped(stream, subject, document.bytes.into(), stamp, id)
                    .await
            } else {
                let message = PublishMessage::build().payload(document.bytes.into());
                self.publish_one(subject, with_id(message, id)).await
            }
        });
        let outcomes = join_all(publications).await;
        settle(self.url(), &ids, outcomes)
    }

    /// Publishes a tombstone per document and purges their parts; returns the last position.
    pub async fn publish_deletes(
        &self,
        collection: &str,
        ids: &[String],
        write_id: &str,
        stamp: Stamp,
    ) -> Result<u64> {
        let stream = self.stream().await?;
        let publications = ids.iter().map(|doc_id| async move {
            let entry = codec::encode(Entry::Delete {
                collection: collection.to_string(),
                doc_id: doc_id.clone(),
            });
            let subject = self.subjects.document(collection, doc_id);
            let id = message_id(collection, write_id, "delete", doc_id);
            let position = self
                .publish_stamped(stream, subject, entry.into(), stamp, id)
                .await?;
            let parts = self.subjects.parts_of_document(collection, doc_id);
            purge_before(stream, self.url(), parts, position).await?;
            Ok(position)
        });
        let outcomes = join_all(publications).await;
        settle(self.url(), ids, outcomes)
    }

    /// Publishes a collection if the log holds none of that name (checked by JetStream against
    /// the collection subject's last sequence, so two replicas creating it at once cannot both
    /// succeed); returns its position, which is the collection's incarnation.
    pub async fn publish_collection_created(&self, entry: Entry) -> Result<u64> {
        let name = entry.collection().to_string();
        let subject = self.subjects.collection(&name);
        let last = match self.last_collection_entry(&name).await? {
            Some((_, Entry::CollectionCreated { .. })) => {
                return Err(LatheError::CollectionExists { name })
            }
            Some((position, _)) => position,
            None => 0,
        };
        let message = PublishMessage::build()
            .payload(codec::encode(entry).into())
            .expected_last_subject_sequence(last);
        match self.send(subject, message).await {
            Err(PublishFailure::Raced) => Err(LatheError::CollectionExists { name }),
            Err(PublishFailure::Other(error)) => Err(error),
            Ok((position, _)) => Ok(position),
        }
    }

    /// Publishes a collection's tombstone, then purges its documents and parts up to it;
    /// returns its position. NOT_FOUND when the log holds no such collection.
    pub async fn publish_collection_deleted(&self, name: &str) -> Result<u64> {
        let stream = self.stream().await?;
        if !matches!(
            self.last_collection_entry(name).await?,
            Some((_, Entry::CollectionCreated { .. }))
        ) {
            return Err(LatheError::CollectionNotFound {
                name: name.to_string(),
            });
        }
        let entry = codec::encode(Entry::CollectionDeleted {
            name: name.to_string(),
        });
        let position = self
            .publish_one(
                self.subjects.collection(name),
                PublishMessage::build().payload(entry.into()),
            )
            .await?;
        for subject in [
            self.subjects.documents_of(name),
            self.subjects.parts_of(name),
        ] {
            purge_before(stream, self.url(), subject, position).await?;
        }
        Ok(position)
    }

    /// Publishes an alias entry (`AliasSet` or `AliasDeleted`) on the alias's subject; returns
    /// its position. The latest entry of the subject is the alias's state.
    pub async fn publish_alias(&self, entry: Entry) -> Result<u64> {
        debug_assert!(matches!(
            entry,
            Entry::AliasSet { .. } | Entry::AliasDeleted { .. }
        ));
        self.stream().await?;
        let subject = self.subjects.alias(entry.collection());
        let message = PublishMessage::build().payload(codec::encode(entry).into());
        self.publish_one(subject, message).await
    }

    /// The position of collection `name` in the log when the log holds it (created and not
    /// deleted since).
    pub async fn collection_position(&self, name: &str) -> Result<Option<u64>> {
        Ok(match self.last_collection_entry(name).await? {
            Some((position, Entry::CollectionCreated { .. })) => Some(position),
            _ => None,
        })
    }

    async fn last_collection_entry(&self, name: &str) -> Result<Option<(u64, Entry)>> {
        let stream = self.stream().await?;
        let message = match stream
            .get_last_raw_message_by_subject(&self.subjects.collection(name))
            .await
        {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(log_unavailable(self.url(), e)),
        };
        match codec::decode(&message.payload) {
            Ok(Decoded::Entry(entry)) => Ok(Some((message.sequence, entry))),
            Ok(Decoded::Parts(_)) | Err(_) => Err(LatheError::internal(format!(
                "the log's entry {} for collection `{name}` is not a collection entry",
                message.sequence
            ))),
        }
    }

    pub(super) async fn publish_one(
        &self,
        subject: String,
        message: PublishMessage,
    ) -> Result<u64> {
        self.send(subject, message)
            .await
            .map(|(sequence, _duplicate)| sequence)
            .map_err(PublishFailure::into_error)
    }

    pub(super) async fn send(
        &self,
        subject: String,
        message: PublishMessage,
    ) -> std::result::Result<(u64, bool), PublishFailure> {
        self.check_connected().map_err(PublishFailure::Other)?;
        let acknowledged = async { self.jetstream.send_publish(subject, message).await?.await };
        match acknowledged.await {
            // A duplicate (its message id seen within the stream's window) answers the first
            // publication's sequence and stores nothing.
            Ok(ack) => Ok((ack.sequence, ack.duplicate)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(PublishFailure::Raced),
            // The acknowledgement did not come: the entry may be stored all the same.
            Err(e) if e.kind() == PublishErrorKind::TimedOut => Err(PublishFailure::Other(
                log_unavailable(
                    self.url(),
                    format!("{e}: JetStream did not acknowledge in time, so the write may still have been stored, and then every replica applies it; send it again with the same write_id and it is stored once"),
                ),
            )),
            Err(e) => Err(PublishFailure::Other(log_unavailable(
                self.url(),
                format!("{e}; nothing was stored"),
            ))),
        }
    }

    /// Parts, then the entry naming them (see the module doc); retried when another version of
    /// the document was stored in between.
    async fn publish_split(
        &self,
        stream: &jetstream::stream::Stream,
        collection: &str,
        document: EncodedDocument,
        max: usize,
        id: Option<String>,
        stamp: Option<Stamp>,
    ) -> Result<u64> {
        let hash = *blake3::hash(&document.bytes).as_bytes();
        let doc_subject = self.subjects.document(collection, &document.doc_id);
        for _ in 0..SPLIT_ATTEMPTS {
            let (last, last_stamp) = self.last_version(stream, &doc_subject).await?;
            if stamp.is_some() && last_stamp >= stamp {
                // A newer write's version is there (see `publish_stamped`).
                return Ok(last);
            }
            let publication = format!("{:016x}", rand::random::<u64>());
            let parts = self
                .publish_parts(stream, collection, &document, max, &publication, &id)
                .await?;
            let (sequences, fresh) = (parts.sequences, parts.fresh);
            let first_part = sequences.iter().copied().min().unwrap_or(0);
            let head = codec::encode_parts(PartsRef {
                collection: collection.to_string(),
                doc_id: document.doc_id.clone(),
                sequences: sequences.clone(),
                total_bytes: document.bytes.len() as u64,
                blake3: hash,
            });
            let mut message = PublishMessage::build()
                .payload(head.into())
                .expected_last_subject_sequence(last);
            if let Some(stamp) = stamp {
                message = message.header(STAMP_HEADER, stamp.header());
            }
            match self
                .send(doc_subject.clone(), with_id(message, id.clone()))
                .await
            {
                Ok((position, true)) => {
                    // The same write was published before: its parts stand; any stored anew
                    // by this call go.
                    for sequence in fresh {
                        let _ = stream.delete_message(sequence).await;
                    }
                    return Ok(position);
                }
                Ok((position, false)) => {
                    let parts = self
                        .subjects
                        .parts_of_document(collection, &document.doc_id);
                    purge_before(stream, self.url(), parts, first_part).await?;
                    return Ok(position);
                }
                Err(PublishFailure::Raced) => {
                    // Only the parts this call stored: one answered as a duplicate may belong
                    // to a stored version. Best effort: what is left is purged by the
                    // document's next split write or its delete.
                    for sequence in fresh {
                        let _ = stream.delete_message(sequence).await;
                    }
                }
                Err(PublishFailure::Other(error)) => return Err(error),
            }
        }
        Err(LatheError::Unavailable(format!(
            "document `{}` was written by others {SPLIT_ATTEMPTS} times while this version was being published; resend it",
            document.doc_id
        )))
    }
}

/// The parts of one split publication, in order, and those this call stored (the others were
/// stored by an earlier publication of the same write: see [`Replication::publish_parts`]).
struct PublishedParts {
    sequences: Vec<u64>,
    fresh: Vec<u64>,
}

impl Replication {
    /// Publishes the parts of `document` under `publication`. With a write's message `id`, part
    /// k carries `<id>-part-<k>`: a write sent again within the dedupe window stores no part
    /// twice (JetStream answers the first one's sequence), so a repeat costs no stream space.
    /// A part answered as a duplicate whose message is gone since (a publication refused after
    /// another version won, then its parts deleted) is stored anew, without an id.
    async fn publish_parts(
        &self,
        stream: &jetstream::stream::Stream,
        collection: &str,
        document: &EncodedDocument,
        max: usize,
        publication: &str,
        id: &Option<String>,
    ) -> Result<PublishedParts> {
        let mut parts = PublishedParts {
            sequences: Vec::new(),
            fresh: Vec::new(),
        };
        for (k, part) in document.bytes.chunks(max).enumerate() {
            let subject = self
                .subjects
                .part(collection, &document.doc_id, publication, k);
            let part_id = id.as_ref().map(|id| format!("{id}-part-{k}"));
            let message = PublishMessage::build().payload(part.to_vec().into());
            let (mut sequence, mut duplicate) = self
                .send(subject.clone(), with_id(message, part_id))
                .await
                .map_err(PublishFailure::into_error)?;
            if duplicate && !part_stored(stream, self.url(), sequence).await? {
                let message = PublishMessage::build().payload(part.to_vec().into());
                (sequence, duplicate) = self
                    .send(subject, message)
                    .await
                    .map_err(PublishFailure::into_error)?;
            }
            if !duplicate {
                parts.fresh.push(sequence);
            }
            parts.sequences.push(sequence);
        }
        Ok(parts)
    }
}

/// Whether the stream still holds the message at `sequence`.
async fn part_stored(stream: &jetstream::stream::Stream, url: &str, sequence: u64) -> Result<bool> {
    match stream.get_raw_message(sequence).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
        Err(e) => Err(log_unavailable(url, e)),
    }
}

/// The `Nats-Msg-Id` of one document of a write with `write_id` (none without one): a hash, so
/// that what the caller chose never reaches a header. JetStream stores a message id seen within
/// the stream's `duplicate_window` once, and answers a repeat with the first one's sequence.
pub(super) fn message_id(
    collection: &str,
    write_id: &str,
    kind: &str,
    doc_id: &str,
) -> Option<String> {
    if write_id.is_empty() {
        return None;
    }
    let hash = crate::content_hash::content_hash([
        collection.as_bytes(),
        b"\0",
        write_id.as_bytes(),
        b"\0",
        kind.as_bytes(),
        b"\0",
        doc_id.as_bytes(),
    ]);
    Some(format!("lathe-{hash:016x}"))
}

fn with_id(message: PublishMessage, id: Option<String>) -> PublishMessage {
    match id {
        Some(id) => message.message_id(id),
        None => message,
    }
}

pub(super) enum PublishFailure {
    /// JetStream refused an entry whose subject moved on since it was read.
    Raced,
    Other(LatheError),
}

impl PublishFailure {
    /// For a publish that sets no expectation (so cannot race).
    pub(super) fn into_error(self) -> LatheError {
        match self {
            PublishFailure::Raced => LatheError::internal("an unconditional publish was refused"),
            PublishFailure::Other(error) => error,
        }
    }
}

/// Purges the messages of `subject` (a filter) stored before `position`.
async fn purge_before(
    stream: &jetstream::stream::Stream,
    url: &str,
    subject: String,
    position: u64,
) -> Result<()> {
    stream
        .purge()
        .filter(subject)
        .sequence(position)
        .await
        .map(|_| ())
        .map_err(|e| log_unavailable(url, e))
}

/// The last position of a batch, or an error that says which documents the log stored.
fn settle(url: &str, ids: &[String], outcomes: Vec<Result<u64>>) -> Result<u64> {
    let stored: Vec<&str> = ids
        .iter()
        .zip(&outcomes)
        .filter(|(_, outcome)| outcome.is_ok())
        .map(|(id, _)| id.as_str())
        .collect();
    let mut last = 0;
    let mut first_error = None;
    for outcome in outcomes {
        match outcome {
            Ok(position) => last = last.max(position),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    let Some(error) = first_error else {
        return Ok(last);
    };
    if stored.is_empty() {
        return Err(error);
    }
    let cause = match error {
        LatheError::LogUnavailable { cause, .. } => cause,
        other => other.to_string(),
    };
    Err(LatheError::LogUnavailable {
        url: url.to_string(),
        cause,
        stored: Some(format!(
            "{} of {} documents were stored, up to position {last}: {}; resend the batch, upserts are idempotent",
            stored.len(),
            ids.len(),
            stored.iter().take(10).map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ")
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_stored_in_part_says_which_documents_were_stored() {
        let ids = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let unavailable = || log_unavailable("nats://n:4222", "timed out");
        assert_eq!(settle("u", &ids, vec![Ok(3), Ok(5), Ok(4)]).unwrap(), 5);
        let error = settle(
            "nats://n:4222",
            &ids,
            vec![Ok(3), Err(unavailable()), Ok(4)],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("nats://n:4222")
                && error.contains("2 of 3 documents were stored, up to position 4: `a`, `c`")
                && error.contains("resend"),
            "{error}"
        );
        let none = settle(
            "u",
            &ids,
            vec![Err(unavailable()), Err(unavailable()), Err(unavailable())],
        );
        assert!(!none.unwrap_err().to_string().contains("were stored"));
    }
}
