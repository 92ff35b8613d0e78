//! What an operator decides once the write log is lost (README, "Replicas"), and how every
//! replica follows the decision:
//!
//! - **Re-seed** (`lathe replicas reseed`): the replica asked publishes, into an emptied (or new)
//!   stream, every collection the log made on it, every live document's stored version (text,
//!   sections, sentence and section vectors: nothing is embedded again) and every alias naming
//!   one of them.
//! - **Start over** (`lathe replicas start-over`): the stream is emptied and nothing is published.
//!
//! Either writes the log's incarnation entry anew as an [`Incarnation`] that names the
//! incarnations it supersedes (the one the asked replica's data came from, and any the stream held
//! meanwhile): first incomplete, so that no replica follows a log still being filled, then
//! complete. A replica whose log is lost waits for such an entry naming the incarnation its own
//! data came from, then adopts it: it drops everything the old log made on it (the asked replica
//! included), records the new incarnation at position 0 and applies the new log from its start,
//! NOT_SERVING until it has caught up. So every replica ends with exactly the new log's data, and
//! nothing of two logs is ever mixed in one replica's state.
//!
//! Only a replica whose log is lost recovers, and only when the call names the stream, so neither
//! happens by accident.

use std::sync::Arc;

use async_nats::jetstream;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::apply::{pause_unless_stopped, Applier};
use super::codec::{self, EncodedDocument, Entry, VectorStamp};
use super::position::{self, ReplicaPosition};
use super::state::Progress;
use super::{check_stream, log_unavailable, stream_error, Replication};
use crate::error::{LatheError, Result};
use crate::index::{DocumentRecord, StoredSettings};

/// Document versions published together while seeding.
const SEED_BATCH: usize = 32;

/// The log's incarnation entry. The first replica to find a stream without one writes a bare id
/// (what [`Incarnation::parse`] reads as a complete incarnation superseding nothing); a recovery
/// writes this record as JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incarnation {
    pub id: String,
    /// The incarnations this one replaces: replicas whose data came from one of them adopt it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<String>,
    /// Who made it and how, for messages.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub origin: String,
    /// False while a recovery is still filling the log.
    #[serde(default = "complete")]
    pub complete: bool,
}

fn complete() -> bool {
    true
}

impl Incarnation {
    pub fn parse(payload: &[u8]) -> Self {
        if payload.first() == Some(&b'{') {
            if let Ok(record) = serde_json::from_slice(payload) {
                return record;
            }
        }
        Self {
            id: String::from_utf8_lossy(payload).into_owned(),
            complete: true,
            ..Self::default()
        }
    }
}

/// What an operator decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// A new log seeded from this replica's data.
    Reseed,
    /// A new, empty log.
    StartOver,
}

/// A replica's data, as a re-seed reads it (the service implements it over its catalog).
pub trait Seed: Send + Sync + 'static {
    /// Every collection the log made here and its settings, by name; and, as `name: why`,
    /// those that cannot be read (damaged or offline), which are not seeded.
    fn collections(&self) -> (Vec<(String, StoredSettings)>, Vec<String>);
    /// Every live document of `collection`, its stored version as a writer took it. Blocking.
    fn documents(
        &self,
        collection: &str,
        visit: &mut dyn FnMut(DocumentRecord) -> Result<()>,
    ) -> Result<()>;
    /// Every alias naming one of `collections`, as (alias, collection).
    fn aliases(&self) -> Vec<(String, String)>;
    /// The model that made the stored vectors.
    fn vectors(&self) -> VectorStamp;
}

/// What a recovery did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The new log's incarnation.
    pub incarnation: String,
    pub collections: u64,
    pub documents: u64,
    pub aliases: u64,
    /// The new log's last position once recovered.
    pub position: u64,
    /// Collections that could not be read, `name: why` (not in the new log).
    pub skipped: Vec<String>,
}

impl Replication {
    /// Replaces the lost log by a new one (see the module doc), `seed`ed from this replica's data
    /// for a re-seed. `confirm` must be the stream's name. FAILED_PRECONDITION unless the log is
    /// lost.
    pub async fn recover(
        &self,
        recovery: Recovery,
        seed: Arc<dyn Seed>,
        confirm: &str,
    ) -> Result<Recovered> {
        if confirm != self.config.stream {
            return Err(LatheError::invalid(
                "confirm_stream",
                format!(
                    "must be this replica's replication.stream, `{}`: a recovery replaces the write log of every replica",
                    self.config.stream
                ),
            ));
        }
        let Some(lost) = self.state.progress().lost else {
            return Err(LatheError::Precondition(format!(
                "the write log this replica follows (stream `{}`) is not lost: there is nothing to recover, and a recovery would replace the log of every replica",
                self.config.stream
            )));
        };
        self.check_connected()?;
        let _recovering = self.recovering.lock().await;
        let wanted = self.wanted_stream();
        let stream = self
            .jetstream
            .get_or_create_stream(wanted.clone())
            .await
            .map_err(|e| stream_error(self.url(), &wanted.name, e))?;
        check_stream(&stream.cached_info().config, &wanted)?;

        let ours = position::load(&self.data_dir)?.and_then(|recorded| recorded.incarnation);
        let mut supersedes: Vec<String> = ours.iter().cloned().collect();
        if let Some(current) = self.incarnation(&stream).await? {
            if !supersedes.contains(&current.id) {
                supersedes.push(current.id);
            }
        }
        stream
            .purge()
            .await
            .map_err(|e| log_unavailable(self.url(), e))?;
        let mut record = Incarnation {
            id: format!("{:032x}", rand::random::<u128>()),
            supersedes,
            origin: origin(recovery, &self.data_dir, ours.as_deref()),
            complete: false,
        };
        tracing::warn!(url = self.url(), stream = self.config.stream, %lost, origin = record.origin, "recovering the lost write log: the stream is emptied and a new log begins");
        let begun = self.write_record(&record, 0).await?;
        let mut recovered = match recovery {
            Recovery::Reseed => self.seed(&stream, seed).await?,
            Recovery::StartOver => Recovered::default(),
        };
        record.complete = true;
        // Only over its own incomplete entry: a recovery begun elsewhere meanwhile emptied the
        // stream again, and this one must not complete a log it no longer holds alone.
        recovered.position = self.write_record(&record, begun).await?;
        recovered.incarnation = record.id.clone();
        tracing::warn!(
            url = self.url(),
            stream = self.config.stream,
            incarnation = record.id,
            supersedes = ?record.supersedes,
            collections = recovered.collections,
            documents = recovered.documents,
            "the write log is recovered: every replica whose data came from a superseded log drops it and applies the new log from its start"
        );
        Ok(recovered)
    }

    /// Writes the incarnation entry, only if the subject's last entry is at `expected` (0: none
    /// yet), so that what another replica wrote meanwhile is never overwritten.
    async fn write_record(&self, record: &Incarnation, expected: u64) -> Result<u64> {
        let payload = serde_json::to_vec(record)
            .map_err(|e| LatheError::internal(format!("encoding the log's incarnation: {e}")))?;
        match self.publish_incarnation(payload, Some(expected)).await {
            Ok(ack) => Ok(ack.sequence),
            Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => {
                Err(LatheError::Precondition(format!(
                    "another replica wrote the log's incarnation while this recovery ran (a replica with an empty data dir, or a recovery begun through another replica): stop it or let it finish, then run one recovery at a time; the stream `{}` holds no complete log of this one, so no replica adopts it",
                    self.config.stream
                )))
            }
            Err(error) => Err(log_unavailable(self.url(), error)),
        }
    }

    /// Publishes every collection, document version and alias `seed` holds.
    async fn seed(
        &self,
        stream: &jetstream::stream::Stream,
        seed: Arc<dyn Seed>,
    ) -> Result<Recovered> {
        let (collections, skipped) = seed.collections();
        let vectors = seed.vectors();
        let mut recovered = Recovered {
            skipped,
            ..Recovered::default()
        };
        for (name, settings) in collections {
            let created = Entry::CollectionCreated {
                name: name.clone(),
                settings: StoredSettings {
                    log_created: None,
                    ..settings
                },
            };
            let message = PublishMessage::build().payload(codec::encode(created).into());
            self.publish_one(self.subjects.collection(&name), message)
                .await?;
            recovered.collections += 1;
            recovered.documents += self.seed_documents(stream, &seed, &name, &vectors).await?;
        }
        for (alias, collection) in seed.aliases() {
            let entry = codec::encode(Entry::AliasSet {
                alias: alias.clone(),
                collection,
            });
            let message = PublishMessage::build().payload(entry.into());
            self.publish_one(self.subjects.alias(&alias), message)
                .await?;
            recovered.aliases += 1;
        }
        Ok(recovered)
    }

    /// Publishes every document of `collection`, read on a blocking thread while earlier ones
    /// are published; how many.
    async fn seed_documents(
        &self,
        stream: &jetstream::stream::Stream,
        seed: &Arc<dyn Seed>,
        collection: &str,
        vectors: &VectorStamp,
    ) -> Result<u64> {
        let (sender, mut records) = tokio::sync::mpsc::channel::<DocumentRecord>(SEED_BATCH * 2);
        let reader = {
            let seed = Arc::clone(seed);
            let collection = collection.to_string();
            tokio::task::spawn_blocking(move || {
                seed.documents(&collection, &mut |record| {
                    sender
                        .blocking_send(record)
                        .map_err(|_| LatheError::internal("the re-seed stopped publishing"))
                })
            })
        };
        let mut published = 0;
        let mut batch = Vec::with_capacity(SEED_BATCH);
        loop {
            let record = records.recv().await;
            let done = record.is_none();
            if let Some(record) = record {
                let doc_id = record.doc_id.clone();
                let entry = Entry::Upsert {
                    collection: collection.to_string(),
                    record,
                    vectors: vectors.clone(),
                };
                batch.push(EncodedDocument {
                    doc_id,
                    bytes: codec::encode(entry),
                });
            }
            if batch.len() == SEED_BATCH || (done && !batch.is_empty()) {
                published += batch.len() as u64;
                let batch = std::mem::replace(&mut batch, Vec::with_capacity(SEED_BATCH));
                self.publish_documents_to(stream, collection, batch, "", None)
                    .await?;
            }
            if done {
                break;
            }
        }
        reader
            .await
            .map_err(|e| LatheError::internal(format!("reading `{collection}` to re-seed: {e}")))?
            .map_err(|e| {
                LatheError::Precondition(format!(
                    "collection `{collection}` could not be read to re-seed the log ({e}); the log holds part of it: re-seed from another replica, or run this again"
                ))
            })?;
        Ok(published)
    }

    /// While the log is lost: waits for a recovered log that supersedes the one this data dir
    /// came from, and adopts it; `false` when told to stop first.
    pub(super) async fn await_recovery(
        &self,
        applier: &Arc<dyn Applier>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let interval = std::time::Duration::from_millis(self.config.watch_interval_ms);
        loop {
            if !pause_unless_stopped(interval, stop).await {
                return false;
            }
            let superseding = match self.superseding().await {
                Ok(superseding) => superseding,
                Err(error) => {
                    tracing::debug!(%error, "looking for a recovered write log");
                    continue;
                }
            };
            let Some((record, created_ns)) = superseding else {
                continue;
            };
            match self.adopt(applier, &record, created_ns).await {
                Ok(()) => return true,
                Err(error) => {
                    tracing::error!(%error, incarnation = record.id, "adopting the recovered write log failed; retrying")
                }
            }
        }
    }

    /// The stream's incarnation and creation time when it is a complete recovery superseding the
    /// incarnation this data dir came from.
    async fn superseding(&self) -> Result<Option<(Incarnation, String)>> {
        let Some(ours) = position::load(&self.data_dir)?.and_then(|recorded| recorded.incarnation)
        else {
            return Ok(None);
        };
        let Ok(stream) = self.jetstream.get_stream(&self.config.stream).await else {
            return Ok(None);
        };
        let created_ns = stream
            .cached_info()
            .created
            .unix_timestamp_nanos()
            .to_string();
        Ok(self.incarnation(&stream).await?.and_then(|record| {
            (record.complete && record.id != ours && record.supersedes.contains(&ours))
                .then_some((record, created_ns))
        }))
    }

    /// Drops what the lost log made here and follows `record`'s log from its start.
    async fn adopt(
        &self,
        applier: &Arc<dyn Applier>,
        record: &Incarnation,
        created_ns: String,
    ) -> Result<()> {
        let _recovering = self.recovering.lock().await;
        let reset = Arc::clone(applier);
        tokio::task::spawn_blocking(move || reset.reset())
            .await
            .map_err(|e| LatheError::internal(format!("dropping the lost log's data: {e}")))??;
        position::store(
            &self.data_dir,
            &ReplicaPosition {
                stream: self.config.stream.clone(),
                stream_created_ns: created_ns,
                applied: 0,
                incarnation: Some(record.id.clone()),
            },
        )?;
        *self.identity.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // Not lost, not caught up: NOT_SERVING until the new log is applied.
        self.state
            .update(|progress| *progress = Progress::default());
        tracing::warn!(url = self.url(), stream = self.config.stream, incarnation = record.id, origin = record.origin, "adopted the recovered write log: what the lost log made here is dropped, and the new log is applied from its start");
        Ok(())
    }
}

/// Who recovers, and how, for the incarnation entry and the replicas' logs.
fn origin(recovery: Recovery, data_dir: &std::path::Path, ours: Option<&str>) -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "a replica".to_string());
    let what = match recovery {
        Recovery::Reseed => "re-seeded from the data of",
        Recovery::StartOver => "started over, empty, from",
    };
    format!(
        "{what} {host} ({}, whose data came from log incarnation {})",
        data_dir.display(),
        ours.unwrap_or("unknown")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incarnation_is_a_bare_id_or_a_recovery_record() {
        let bare = Incarnation::parse(b"5f0c1e");
        assert_eq!(
            bare,
            Incarnation {
                id: "5f0c1e".into(),
                complete: true,
                ..Incarnation::default()
            }
        );
        let record = Incarnation {
            id: "77aa".into(),
            supersedes: vec!["5f0c1e".into()],
            origin: "re-seeded".into(),
            complete: false,
        };
        let payload = serde_json::to_vec(&record).unwrap();
        assert_eq!(Incarnation::parse(&payload), record);
        // A record without `complete` (none is written so) reads as complete.
        let written = br#"{"id":"77aa","supersedes":["5f0c1e"]}"#;
        assert!(Incarnation::parse(written).complete);
    }
}
