//! `lathe ingest`: files or folders into a collection, in batches sized to finish well within a
//! call's deadline.
//!
//! Each batch is one `wait` UpsertDocuments call with a `write_id` that hashes its content: the
//! server queues it durably, and answers once it is visible; a batch whose deadline passes while
//! it is queued is followed to its end through its operation (`ops::follow`), not sent again. Batches are cut by bytes, sized from the throughput measured so far so that
//! one takes about `--batch-seconds` (a third of the server's default 30 s deadline); a batch that
//! still runs past its deadline is retried at a quarter the size (an upsert is idempotent), and
//! one document that alone outlasts it goes as an upload stream (no server deadline). Three batches
//! are in flight at once (`--in-flight`), so that the server cuts the next ones into sections
//! while it indexes and commits one; with repeated document ids, one at a time. Progress
//! (documents, bytes, rate, ETA) is printed after each batch, and the files left out (by why)
//! before the first. Resuming after an interruption is
//! running the same command again: the server reuses the stored vectors of every section whose
//! text is unchanged, so documents already stored cost no inference.

mod batches;
mod files;
mod kinds;

use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::stream::{FuturesOrdered, StreamExt};
use tonic::Code;

use crate::cli::units;
use crate::proto;
use batches::{BatchQueue, BatchSizer, Progress};
pub use files::documents_from_jsonl;
use files::{documents_from_paths, format_from_name};
use kinds::KINDS_READ;

#[derive(clap::Args, Debug)]
pub struct IngestArgs {
    /// Files or folders; folders are walked (hidden entries left out) for .md .markdown .html
    /// .htm .txt .rst .adoc .org .csv .tsv .jsonl and source code files, also gzipped (.gz). Each
    /// document gets the file's `path` (relative to the folder), `dir` and `ext` as metadata
    /// (`lathe query --filter ext=py`), and tables and code `strategy=csv` or `strategy=code`.
    /// Other files are skipped and counted.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The collection to write to (created when missing).
    #[arg(long, short)]
    pub collection: String,
    /// The server: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// Budget tokenizer if the collection has to be created.
    #[arg(long, default_value = "minilm")]
    pub tokenizer: String,
    /// Section size in tokens if the collection has to be created.
    #[arg(long)]
    pub section_tokens: Option<u32>,
    /// Most documents per batch (the byte size from `--batch-seconds` usually decides first:
    /// each batch is one commit, so small documents are best sent many at a time).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Seconds one batch should take; batch sizes in bytes follow from the measured throughput.
    #[arg(long, default_value_t = 10.0)]
    pub batch_seconds: f64,
    /// Bytes of document text in the first batch, before any throughput is measured.
    #[arg(long, default_value_t = 64 * 1024)]
    pub first_batch_bytes: usize,
    /// Batches sent before the first is answered: the server cuts the next ones into sections
    /// while it indexes and commits this one.
    #[arg(long, default_value_t = 3)]
    pub in_flight: usize,
    /// Deadline of each batch's call, in seconds (the server's `server.request_timeout_ms`
    /// still applies when shorter).
    #[arg(long, default_value_t = 30.0)]
    pub deadline_seconds: f64,
    /// Treat .txt files and JSONL documents without a format as this format.
    #[arg(long, value_parser = ["plain", "markdown", "html"], default_value = "plain")]
    pub default_format: String,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
}

pub async fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let default_format = format_from_name(&args.default_format)?;
    let found = documents_from_paths(&args.paths, default_format)?;
    for line in found.skipped_summary() {
        eprintln!("{line}");
    }
    let documents = found.documents;
    if documents.is_empty() {
        anyhow::bail!("no documents found: ingest reads {KINDS_READ}");
    }
    anyhow::ensure!(
        args.batch_seconds > 0.0 && args.deadline_seconds > 0.0,
        "--batch-seconds and --deadline-seconds must be above 0"
    );
    let mut client = args.connect.connect(&args.addr).await?;
    create_collection_unless_present(&mut client, &args).await?;

    let sizes: Vec<usize> = documents.iter().map(|d| d.text.len()).collect();
    let mut progress = Progress::new(&sizes);
    let mut sizer = BatchSizer::new(args.first_batch_bytes, args.batch_seconds);
    let deadline = Duration::from_secs_f64(args.deadline_seconds);
    let mut sections = 0u64;
    // Batches are cut in order; one that ran past its deadline comes back in smaller ones.
    let mut batches = BatchQueue::new(&sizes, args.batch.max(1));
    let most_in_flight = batches_in_flight(&documents, args.in_flight);
    let mut in_flight = FuturesOrdered::new();
    loop {
        while in_flight.len() < most_in_flight {
            let Some(range) = batches.next_batch(sizer.batch_bytes()) else {
                break;
            };
            let batch = &documents[range.clone()];
            let client = client.clone();
            in_flight.push_back(send_timed(client, &args.collection, batch, range, deadline));
        }
        let Some((range, batch_bytes, elapsed, answer)) = in_flight.next().await else {
            break;
        };
        match answer? {
            Ok(response) => {
                let response = response.into_inner();
                sizer.observe(batch_bytes, elapsed);
                sections += u64::from(response.sections);
                progress.done(range.len(), batch_bytes);
                eprintln!("{}", progress.line());
            }
            // Not applied, or applied whole: either way sending it again is safe, and cheap for
            // what was stored. Smaller, unless it is one document already.
            Err(status) if ran_past_deadline(&status) && range.len() > 1 => {
                sizer.timed_out(batch_bytes);
                eprintln!(
                    "a batch of {} documents ({}) ran past its deadline; retrying in batches of at most {}",
                    range.len(),
                    units::bytes(batch_bytes as u64),
                    units::bytes(sizer.batch_bytes() as u64)
                );
                batches.retry(range, sizer.batch_bytes());
            }
            Err(status) => return Err(batch_failed(&range, &status, &progress)),
        }
    }
    println!(
        "{}",
        ingest_summary(&args.collection, documents.len(), sections, &progress)
    );
    Ok(())
}

/// Sends the batch of documents `range` (see [`send_batch`]); returns the range, its text bytes
/// and how long the call took beside the answer.
async fn send_timed(
    mut client: crate::client::Client,
    collection: &str,
    batch: &[proto::Document],
    range: Range<usize>,
    deadline: Duration,
) -> (Range<usize>, usize, Duration, SentBatch) {
    let batch_bytes = batch.iter().map(|document| document.text.len()).sum();
    let started = Instant::now();
    let answer = send_batch(&mut client, collection, batch, batch_bytes, deadline).await;
    (range, batch_bytes, started.elapsed(), answer)
}

/// A batch the server refused: what failed, and what is stored already.
fn batch_failed(
    range: &Range<usize>,
    status: &tonic::Status,
    progress: &Progress,
) -> anyhow::Error {
    anyhow::anyhow!(
        "upserting documents {}..{} failed: {} ({} of the {} documents are stored; run the command again to resume)",
        range.start,
        range.end,
        crate::client::status_line(status),
        progress.documents,
        progress.total_documents,
    )
}

/// Batches sent before the first is answered: `in_flight` (at least one), or one at a time when
/// document ids repeat.
fn batches_in_flight(documents: &[proto::Document], in_flight: usize) -> usize {
    if has_repeated_ids(documents) {
        eprintln!(
            "some document ids repeat: sending one batch at a time, so the last version wins"
        );
        1
    } else {
        in_flight.max(1)
    }
}

/// What sending a batch gives: a local failure (the deadline header), or the server's answer.
type SentBatch = anyhow::Result<Result<tonic::Response<proto::WriteResponse>, tonic::Status>>;

/// Whether two of `documents` have the same id: batches in flight side by side may be applied
/// in either order, and of one id the last version given must win.
fn has_repeated_ids(documents: &[proto::Document]) -> bool {
    let mut ids = std::collections::HashSet::with_capacity(documents.len());
    !documents
        .iter()
        .all(|document| ids.insert(document.id.as_str()))
}

/// Sends one batch as a `wait` UpsertDocuments call under `deadline`; a single document whose
/// call ran past the deadline is sent again as an upload stream. The outer error is a local
/// failure (the deadline header); the inner result is the server's answer.
async fn send_batch(
    client: &mut crate::client::Client,
    collection: &str,
    batch: &[proto::Document],
    batch_bytes: usize,
    deadline: Duration,
) -> SentBatch {
    let write_id = batch_write_id(collection, batch);
    let message = || proto::UpsertDocumentsRequest {
        collection: collection.to_string(),
        documents: batch.to_vec(),
        wait: true,
        write_id: write_id.clone(),
    };
    let mut request = tonic::Request::new(message());
    // The deadline as the header only, so that the server answers DEADLINE_EXCEEDED (tonic's
    // client timer would answer CANCELLED itself, whatever happened on the server).
    let header = format!("{}m", deadline.as_millis().max(1));
    request.metadata_mut().insert(
        "grpc-timeout",
        header.parse().context("the deadline as a header")?,
    );
    Ok(match client.upsert_documents(request).await {
        // Queued, and applied after the deadline: followed to its end (not sent again).
        Err(status) if super::ops::queued_operation(&status).is_some() => {
            let id = super::ops::queued_operation(&status).unwrap_or_default();
            let operation = super::ops::follow(client, id, false).await?;
            super::ops::ended_well(&operation)?;
            Ok(tonic::Response::new(proto::WriteResponse {
                documents: operation.documents_total,
                sections: operation.sections,
                generation: operation.generation,
                consistency_token: operation.consistency_token,
                operation_ids: vec![id],
                operation: Some(operation),
            }))
        }
        // One document whose embedding alone outlasts the deadline: an upload stream has
        // no server deadline (`server.request_timeout_ms` is for unary calls).
        Err(status) if ran_past_deadline(&status) && batch.len() == 1 => {
            eprintln!(
                "document {} ({}) takes longer than the deadline alone; sending it as an upload stream, which has none",
                batch[0].id,
                units::bytes(batch_bytes as u64)
            );
            client
                .upload_documents(tokio_stream::iter([message()]))
                .await
        }
        other => other,
    })
}

/// The idempotency key of a batch: a hash of the collection and the batch's documents, so that
/// a batch sent again (a retry, or the same command run again within the server's dedupe
/// window) is answered by its first operation instead of being queued twice.
fn batch_write_id(collection: &str, batch: &[proto::Document]) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    collection.hash(&mut hasher);
    for document in batch {
        document.id.hash(&mut hasher);
        document.title.hash(&mut hasher);
        document.text.hash(&mut hasher);
        document.format.hash(&mut hasher);
        let mut metadata: Vec<_> = document.metadata.iter().collect();
        metadata.sort();
        metadata.hash(&mut hasher);
        for section in &document.sections {
            (section.start, section.end, &section.title).hash(&mut hasher);
        }
    }
    format!("lathe-ingest-{:016x}-{}", hasher.finish(), batch.len())
}

/// The closing line: `ingested 5 documents (12 sections, 3.40 KB) into docs in 0.52 s: 9.6
/// documents/s, 6.54 KB/s`.
fn ingest_summary(
    collection: &str,
    documents: usize,
    sections: u64,
    progress: &Progress,
) -> String {
    let elapsed = progress.started.elapsed();
    format!(
        "ingested {documents} documents ({sections} sections, {}) into {collection} in {}: {} documents/s, {}",
        units::bytes(progress.total_bytes as u64),
        units::duration(elapsed),
        units::count_rate(documents as u64, elapsed),
        units::rate(progress.total_bytes as u64, elapsed),
    )
}

/// DEADLINE_EXCEEDED, or the CANCELLED "Timeout expired" that tonic's own timers answer when
/// they fire first (seen on an overloaded server): the call ran past its deadline.
fn ran_past_deadline(status: &tonic::Status) -> bool {
    match status.code() {
        Code::DeadlineExceeded => true,
        Code::Cancelled => status.message().contains("Timeout expired"),
        _ => false,
    }
}

/// Creates the collection with the tokenizer and section size asked for; one that exists is
/// used as it is.
async fn create_collection_unless_present(
    client: &mut crate::client::Client,
    args: &IngestArgs,
) -> anyhow::Result<()> {
    let create = proto::CreateCollectionRequest {
        name: args.collection.clone(),
        settings: Some(proto::CollectionSettings {
            budget_tokenizer: args.tokenizer.clone(),
            default_chunking: None,
            section_tokens: args.section_tokens,
        }),
    };
    match client.create_collection(create).await {
        Ok(_) => eprintln!("created collection {}", args.collection),
        Err(status) if status.code() == Code::AlreadyExists => {}
        Err(status) => {
            return Err(anyhow::anyhow!(
                "creating collection {}: {}",
                args.collection,
                crate::client::status_line(&status)
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_ids_are_found() {
        let document = |id: &str| proto::Document {
            id: id.into(),
            ..Default::default()
        };
        assert!(!has_repeated_ids(&[document("a"), document("b")]));
        assert!(has_repeated_ids(&[
            document("a"),
            document("b"),
            document("a")
        ]));
    }

    #[test]
    fn deadline_answers_are_told_from_other_failures() {
        assert!(ran_past_deadline(&tonic::Status::deadline_exceeded("late")));
        assert!(ran_past_deadline(&tonic::Status::cancelled(
            "Timeout expired"
        )));
        assert!(!ran_past_deadline(&tonic::Status::cancelled(
            "client went away"
        )));
        assert!(!ran_past_deadline(&tonic::Status::unavailable(
            "Timeout expired"
        )));
    }
}
