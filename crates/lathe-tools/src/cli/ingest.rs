//! `lathe ingest`: files or folders into a collection, in batches sized to finish well within a
//! call's deadline.
//!
//! Each batch is one `wait` UpsertDocuments call: applied whole or not at all, and acknowledged
//! only once durable. Batches are cut by bytes, sized from the throughput measured so far so that
//! one takes about `--batch-seconds` (a third of the server's default 30 s deadline); a batch that
//! still runs past its deadline is retried at a quarter the size (an upsert is idempotent), and
//! one document that alone outlasts it goes as an upload stream (no server deadline). Three batches
//! are in flight at once (`--in-flight`), so that the server cuts the next ones into sections
//! while it indexes and commits one; with repeated document ids, one at a time. Progress
//! (documents, MB, MB/s, ETA) is printed after each batch. Resuming after an interruption is
//! running the same command again: the server reuses the stored vectors of every section whose
//! text is unchanged, so documents already stored cost no inference.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::stream::{FuturesOrdered, StreamExt};
use serde::Deserialize;
use tonic::Code;

use crate::proto;

#[derive(clap::Args, Debug)]
pub struct IngestArgs {
    /// Files or folders; folders are walked for .md, .markdown, .html, .htm, .txt and .jsonl.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    #[arg(long, short)]
    pub collection: String,
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
}

/// One line of a .jsonl file (the layout of the eval datasets' docs.jsonl).
#[derive(Deserialize)]
struct JsonDocument {
    #[serde(alias = "doc_id")]
    id: String,
    #[serde(default)]
    title: String,
    text: String,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default)]
    sections: Vec<JsonSection>,
}

#[derive(Deserialize)]
struct JsonSection {
    start: u64,
    end: u64,
    #[serde(default)]
    title: String,
}

fn format_from_name(name: &str) -> anyhow::Result<proto::DocumentFormat> {
    Ok(match name {
        "plain" | "text" | "txt" => proto::DocumentFormat::Plain,
        "markdown" | "md" => proto::DocumentFormat::Markdown,
        "html" => proto::DocumentFormat::Html,
        other => anyhow::bail!("unknown format `{other}`: expected plain, markdown or html"),
    })
}

/// Parses a .jsonl file: one document per non-blank line. An error names the line (1-based) and
/// what is wrong with it; nothing is returned unless every line parses.
pub fn documents_from_jsonl(
    text: &str,
    default_format: proto::DocumentFormat,
) -> anyhow::Result<Vec<proto::Document>> {
    let mut documents = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_number = number + 1;
        let document: JsonDocument = serde_json::from_str(line).with_context(|| {
            match lone_surrogate_escape(line) {
                // serde_json's own words for it ("unexpected end of hex escape") name no surrogate.
                Some((column, escape)) => format!(
                    "line {line_number}: not a document: lone UTF-16 surrogate escape `{escape}` at column {column} (a JSON string must hold Unicode scalar values: a high surrogate \\ud800-\\udbff must be followed by a low one \\udc00-\\udfff)"
                ),
                None => format!("line {line_number}: not a document"),
            }
        })?;
        let format = match &document.format {
            Some(name) => format_from_name(name).with_context(|| format!("line {line_number}"))?,
            None => default_format,
        };
        documents.push(proto::Document {
            id: document.id,
            title: document.title,
            text: document.text,
            format: format as i32,
            metadata: document.metadata,
            sections: document
                .sections
                .into_iter()
                .map(|s| proto::SectionBoundary {
                    start: s.start,
                    end: s.end,
                    title: s.title,
                })
                .collect(),
        });
    }
    Ok(documents)
}

/// The first `\uXXXX` escape in `line` that is a UTF-16 surrogate without its partner, with its
/// 1-based byte column.
fn lone_surrogate_escape(line: &str) -> Option<(usize, String)> {
    let bytes = line.as_bytes();
    let code_unit_at = |at: usize| -> Option<u16> {
        let digits = bytes.get(at + 2..at + 6)?;
        if bytes.get(at + 1) != Some(&b'u') {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        let Some(unit) = code_unit_at(at) else {
            // Any other escape (`\\`, `\"`, `\n`, ...) is two bytes long.
            at += 2;
            continue;
        };
        let escape = || line[at..at + 6].to_string();
        match unit {
            0xD800..=0xDBFF => match code_unit_at(at + 6) {
                Some(0xDC00..=0xDFFF) => at += 12,
                _ => return Some((at + 1, escape())),
            },
            0xDC00..=0xDFFF => return Some((at + 1, escape())),
            _ => at += 6,
        }
    }
    None
}

fn documents_from_file(
    path: &Path,
    root: &Path,
    default_format: proto::DocumentFormat,
) -> anyhow::Result<Vec<proto::Document>> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let id = path
        .strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned();
    let read =
        || std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
    let single = |format: proto::DocumentFormat| -> anyhow::Result<Vec<proto::Document>> {
        let title = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(vec![proto::Document {
            id: id.clone(),
            title,
            text: read()?,
            format: format as i32,
            ..Default::default()
        }])
    };
    match extension.as_str() {
        "md" | "markdown" => single(proto::DocumentFormat::Markdown),
        "html" | "htm" => single(proto::DocumentFormat::Html),
        "txt" => single(default_format),
        "jsonl" => documents_from_jsonl(&read()?, default_format)
            .with_context(|| format!("{}: not a JSONL document file", path.display())),
        _ => Ok(Vec::new()),
    }
}

pub async fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let default_format = format_from_name(&args.default_format)?;
    let documents = documents_from_paths(&args.paths, default_format)?;
    if documents.is_empty() {
        anyhow::bail!("no .md, .markdown, .html, .htm, .txt or .jsonl documents found");
    }
    anyhow::ensure!(
        args.batch_seconds > 0.0 && args.deadline_seconds > 0.0,
        "--batch-seconds and --deadline-seconds must be above 0"
    );
    let mut client = crate::client::connect(&args.addr).await?;
    create_collection_unless_present(&mut client, &args).await?;

    let sizes: Vec<usize> = documents.iter().map(|d| d.text.len()).collect();
    let mut progress = Progress::new(&sizes);
    let mut sizer = BatchSizer::new(args.first_batch_bytes, args.batch_seconds);
    let deadline = Duration::from_secs_f64(args.deadline_seconds);
    let (mut sections, mut generation) = (0u64, 0u64);
    // Batches are cut in order; one that ran past its deadline comes back here in smaller ones.
    let mut retries: VecDeque<Range<usize>> = VecDeque::new();
    let mut next = 0;
    let most_in_flight = if has_repeated_ids(&documents) {
        eprintln!(
            "some document ids repeat: sending one batch at a time, so the last version wins"
        );
        1
    } else {
        args.in_flight.max(1)
    };
    let mut in_flight = FuturesOrdered::new();
    loop {
        while in_flight.len() < most_in_flight {
            let range = match retries.pop_front() {
                Some(range) => range,
                None if next < documents.len() => {
                    let end = batch_end(&sizes, next, sizer.batch_bytes(), args.batch.max(1));
                    std::mem::replace(&mut next, end)..end
                }
                None => break,
            };
            let batch_bytes: usize = sizes[range.clone()].iter().sum();
            let (mut client, collection, batch) = (
                client.clone(),
                args.collection.as_str(),
                &documents[range.clone()],
            );
            in_flight.push_back(async move {
                let started = Instant::now();
                let answer =
                    send_batch(&mut client, collection, batch, batch_bytes, deadline).await;
                (range, batch_bytes, started.elapsed(), answer)
            });
        }
        let Some((range, batch_bytes, elapsed, answer)) = in_flight.next().await else {
            break;
        };
        match answer? {
            Ok(response) => {
                let response = response.into_inner();
                sizer.observe(batch_bytes, elapsed);
                sections += u64::from(response.sections);
                generation = generation.max(response.generation);
                progress.done(range.len(), batch_bytes);
                eprintln!("{}", progress.line());
            }
            // Not applied, or applied whole: either way sending it again is safe, and cheap for
            // what was stored. Smaller, unless it is one document already.
            Err(status) if ran_past_deadline(&status) && range.len() > 1 => {
                sizer.timed_out(batch_bytes);
                eprintln!(
                    "a batch of {} documents ({:.2} MB) ran past its deadline; retrying in batches of at most {:.2} MB",
                    range.len(),
                    batch_bytes as f64 / 1e6,
                    sizer.batch_bytes() as f64 / 1e6
                );
                let mut start = range.start;
                while start < range.end {
                    let end = batch_end(&sizes[..range.end], start, sizer.batch_bytes(), args.batch.max(1));
                    retries.push_back(start..end);
                    start = end;
                }
            }
            Err(status) => {
                return Err(anyhow::anyhow!(
                    "upserting documents {}..{} failed: {:?}: {} ({} of the {} documents are stored; run the command again to resume)",
                    range.start,
                    range.end,
                    status.code(),
                    status.message(),
                    progress.documents,
                    documents.len(),
                ))
            }
        }
    }
    print_ingest_summary(
        &args.collection,
        documents.len(),
        sections,
        generation,
        &progress,
    );
    Ok(())
}

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
    client: &mut crate::proto::lathe_client::LatheClient<tonic::transport::Channel>,
    collection: &str,
    batch: &[proto::Document],
    batch_bytes: usize,
    deadline: Duration,
) -> anyhow::Result<Result<tonic::Response<proto::WriteResponse>, tonic::Status>> {
    let message = || proto::UpsertDocumentsRequest {
        collection: collection.to_string(),
        documents: batch.to_vec(),
        wait: true,
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
        // One document whose embedding alone outlasts the deadline: an upload stream has
        // no server deadline (`server.request_timeout_ms` is for unary calls).
        Err(status) if ran_past_deadline(&status) && batch.len() == 1 => {
            eprintln!(
                "document {} ({:.2} MB) takes longer than the deadline alone; sending it as an upload stream, which has none",
                batch[0].id,
                batch_bytes as f64 / 1e6
            );
            client
                .upload_documents(tokio_stream::iter([message()]))
                .await
        }
        other => other,
    })
}

/// The closing line: what was stored, how fast, and the generation that makes it visible.
fn print_ingest_summary(
    collection: &str,
    documents: usize,
    sections: u64,
    generation: u64,
    progress: &Progress,
) {
    let seconds = progress.started.elapsed().as_secs_f64();
    println!(
        "ingested {} documents ({} sections, {:.1} MB) into {} in {:.2} s: {:.1} docs/s, {:.2} MB/s; visible at generation {}",
        documents,
        sections,
        progress.total_bytes as f64 / 1e6,
        collection,
        seconds,
        documents as f64 / seconds,
        progress.total_bytes as f64 / 1e6 / seconds,
        generation
    );
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

/// The end of the batch that starts at document `start`: documents while their text adds up to
/// at most `bytes` (always at least one, however large), and at most `most` documents.
fn batch_end(sizes: &[usize], start: usize, bytes: usize, most: usize) -> usize {
    let mut end = start;
    let mut taken = 0usize;
    while end < sizes.len() && end - start < most {
        if end > start && taken + sizes[end] > bytes {
            break;
        }
        taken += sizes[end];
        end += 1;
    }
    end
}

/// Sizes batches in bytes so that one takes about `target` seconds at the throughput measured
/// so far (the latest batch weighs most: load on the server changes).
#[derive(Debug)]
struct BatchSizer {
    batch_bytes: usize,
    target_seconds: f64,
    /// Bytes per second, smoothed over the batches so far; None before the first.
    throughput: Option<f64>,
}

/// Smallest batch the sizer asks for, in bytes (a single larger document is still sent alone).
const MIN_BATCH_BYTES: usize = 4 * 1024;
/// Largest batch, in bytes: well under the server's default 64 MiB message limit.
const MAX_BATCH_BYTES: usize = 16 << 20;

impl BatchSizer {
    fn new(first_batch_bytes: usize, target_seconds: f64) -> Self {
        Self {
            batch_bytes: first_batch_bytes.clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES),
            target_seconds,
            throughput: None,
        }
    }

    fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// A batch of `bytes` took `elapsed`: the next is sized to take the target time, growing at
    /// most 4-fold at a time (one fast small batch says little about a large one).
    fn observe(&mut self, bytes: usize, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64().max(1e-3);
        let measured = bytes as f64 / seconds;
        let throughput = match self.throughput {
            None => measured,
            Some(before) => 0.5 * before + 0.5 * measured,
        };
        self.throughput = Some(throughput);
        let wanted = (throughput * self.target_seconds) as usize;
        self.batch_bytes = wanted
            .min(self.batch_bytes.saturating_mul(4))
            .clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES);
    }

    /// A batch of `bytes` ran past its deadline: the next is at most a quarter of it.
    fn timed_out(&mut self, bytes: usize) {
        self.batch_bytes = (bytes / 4).clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES);
        self.throughput = self.throughput.map(|t| t / 4.0);
    }
}

/// Documents and bytes stored so far, and the line that reports them.
struct Progress {
    started: Instant,
    total_documents: usize,
    total_bytes: usize,
    documents: usize,
    bytes: usize,
}

impl Progress {
    fn new(sizes: &[usize]) -> Self {
        Self {
            started: Instant::now(),
            total_documents: sizes.len(),
            total_bytes: sizes.iter().sum(),
            documents: 0,
            bytes: 0,
        }
    }

    fn done(&mut self, documents: usize, bytes: usize) {
        self.documents += documents;
        self.bytes += bytes;
    }

    fn line(&self) -> String {
        progress_line(
            self.documents,
            self.total_documents,
            self.bytes,
            self.total_bytes,
            self.started.elapsed(),
        )
    }
}

/// `documents 120/500, 1.20/5.00 MB, 0.40 MB/s, ETA 9.5 s`.
fn progress_line(
    documents: usize,
    total_documents: usize,
    bytes: usize,
    total_bytes: usize,
    elapsed: Duration,
) -> String {
    let seconds = elapsed.as_secs_f64().max(1e-3);
    let rate = bytes as f64 / seconds;
    let eta = if rate > 0.0 {
        format!("{:.1} s", total_bytes.saturating_sub(bytes) as f64 / rate)
    } else {
        "unknown".to_string()
    };
    format!(
        "documents {documents}/{total_documents}, {:.2}/{:.2} MB, {:.2} MB/s, ETA {eta}",
        bytes as f64 / 1e6,
        total_bytes as f64 / 1e6,
        rate / 1e6
    )
}

/// The documents of every file given, and of every file under every folder given (in path order).
fn documents_from_paths(
    paths: &[PathBuf],
    default_format: proto::DocumentFormat,
) -> anyhow::Result<Vec<proto::Document>> {
    let mut documents = Vec::new();
    for root in paths {
        if root.is_file() {
            let parent = root.parent().unwrap_or(Path::new(""));
            documents.extend(documents_from_file(root, parent, default_format)?);
            continue;
        }
        let mut files: Vec<PathBuf> = walkdir::WalkDir::new(root)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_file())
            .map(|entry| entry.into_path())
            .collect();
        files.sort();
        for file in files {
            documents.extend(documents_from_file(&file, root, default_format)?);
        }
    }
    Ok(documents)
}

/// Creates the collection with the tokenizer and section size asked for; one that exists is
/// used as it is.
async fn create_collection_unless_present(
    client: &mut crate::proto::lathe_client::LatheClient<tonic::transport::Channel>,
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
                status.message()
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_fill_up_to_their_bytes_and_always_take_one_document() {
        let sizes = [10, 20, 30, 500, 5];
        assert_eq!(batch_end(&sizes, 0, 60, 64), 3);
        assert_eq!(batch_end(&sizes, 0, 29, 64), 1);
        // A document larger than the batch goes alone.
        assert_eq!(batch_end(&sizes, 3, 60, 64), 4);
        assert_eq!(batch_end(&sizes, 4, 60, 64), 5);
        // The document count caps it too.
        assert_eq!(batch_end(&sizes, 0, 1000, 2), 2);
        // Consecutive batches cover every document once.
        let mut covered = Vec::new();
        let mut start = 0;
        while start < sizes.len() {
            let end = batch_end(&sizes, start, 40, 64);
            assert!(end > start);
            covered.extend(start..end);
            start = end;
        }
        assert_eq!(covered, [0, 1, 2, 3, 4]);
    }

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

    #[test]
    fn batch_sizes_follow_the_measured_throughput() {
        let mut sizer = BatchSizer::new(64 * 1024, 10.0);
        assert_eq!(sizer.batch_bytes(), 64 * 1024);
        // 64 KiB in 1 s: 10 s would take 640 KiB, but growth is at most 4-fold a step.
        sizer.observe(64 * 1024, Duration::from_secs(1));
        assert_eq!(sizer.batch_bytes(), 256 * 1024);
        sizer.observe(256 * 1024, Duration::from_secs(4));
        assert_eq!(sizer.batch_bytes(), 640 * 1024);
        // The server slows down 10-fold: the next batch shrinks at once (by the smoothed rate).
        sizer.observe(640 * 1024, Duration::from_secs(100));
        let slowed = sizer.batch_bytes();
        assert!(slowed < 640 * 1024, "{slowed}");
        // A deadline passed: a quarter of that batch, never below the floor.
        sizer.timed_out(slowed);
        assert_eq!(sizer.batch_bytes(), (slowed / 4).max(MIN_BATCH_BYTES));
        sizer.timed_out(1);
        assert_eq!(sizer.batch_bytes(), MIN_BATCH_BYTES);
        // Nor above the ceiling, however fast.
        let mut fast = BatchSizer::new(MAX_BATCH_BYTES, 10.0);
        fast.observe(MAX_BATCH_BYTES, Duration::from_millis(1));
        assert_eq!(fast.batch_bytes(), MAX_BATCH_BYTES);
    }

    #[test]
    fn progress_names_documents_megabytes_rate_and_what_is_left() {
        let line = progress_line(120, 500, 1_200_000, 5_000_000, Duration::from_secs(3));
        assert_eq!(
            line,
            "documents 120/500, 1.20/5.00 MB, 0.40 MB/s, ETA 9.5 s"
        );
        let start = progress_line(0, 5, 0, 100, Duration::from_secs(1));
        assert!(start.ends_with("ETA unknown"), "{start}");
    }

    #[test]
    fn jsonl_reads_documents_and_skips_blank_lines() {
        let text = "{\"id\":\"a\",\"text\":\"alpha\"}\n\n{\"doc_id\":\"b\",\"text\":\"# beta\",\"format\":\"markdown\",\"metadata\":{\"k\":\"v\"}}\n";
        let documents = documents_from_jsonl(text, proto::DocumentFormat::Plain).unwrap();
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[0].id, "a");
        assert_eq!(documents[0].format, proto::DocumentFormat::Plain as i32);
        assert_eq!(documents[1].id, "b");
        assert_eq!(documents[1].format, proto::DocumentFormat::Markdown as i32);
        assert_eq!(documents[1].metadata["k"], "v");
    }

    #[test]
    fn jsonl_lone_surrogate_is_an_error_naming_the_line() {
        let text = "{\"id\":\"a\",\"text\":\"ok\"}\n{\"id\":\"b\",\"text\":\"bad \\ud800 half\"}\n";
        let error = documents_from_jsonl(text, proto::DocumentFormat::Plain).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("line 2"), "{message}");
        assert!(message.contains("surrogate"), "{message}");
    }

    #[test]
    fn lone_surrogates_are_found_and_pairs_and_escaped_backslashes_are_not() {
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"x \ud800 y"}"#),
            Some((9, r"\ud800".to_string()))
        );
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"\udc00"}"#),
            Some((7, r"\udc00".to_string()))
        );
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"\ud83d\ude00 \u00e9"}"#),
            None
        );
        assert_eq!(lone_surrogate_escape(r#"{"a":"\\ud800"}"#), None);
        assert_eq!(
            lone_surrogate_escape(r#"{"a":"\ud800\u0041"}"#),
            Some((7, r"\ud800".to_string()))
        );
    }

    #[test]
    fn jsonl_unknown_format_names_the_line_and_the_choices() {
        let text = "{\"id\":\"a\",\"text\":\"x\",\"format\":\"pdf\"}";
        let message = format!(
            "{:#}",
            documents_from_jsonl(text, proto::DocumentFormat::Plain).unwrap_err()
        );
        assert!(message.contains("line 1"), "{message}");
        assert!(message.contains("plain, markdown or html"), "{message}");
    }
}
