//! Freshness and consistency under concurrency, through the real gRPC server with the result cache
//! and the dense (MiniLM) stage on:
//! - read-your-writes: a query issued after an acknowledged `wait` write sees it;
//! - no stale answers: a query never returns a document whose delete was acknowledged before it
//!   started, nor a version older than the newest one acknowledged before it started;
//! - no mixed versions: every chunk is the exact slice of the version it claims, and the chunks of
//!   one document in one answer all come from one version (result and section caches included);
//! - the result cache follows writes: the same query text asked again after a write answers anew.
//!
//! Every document is Markdown with three headed sections. Each version carries made-up marker words
//! (one per document, one per document and version) so BM25 finds exactly what a check targets, its
//! version number in its metadata, and a length that differs from its neighbours' so that offsets
//! of different versions never agree by chance.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::api::proto::DocumentFormat as Format;
use tonic::transport::Channel;

const COLLECTION: &str = "fresh";
const WRITERS: usize = 3;
const DOCUMENTS_PER_WRITER: usize = 2;
const DOCUMENTS: usize = WRITERS * DOCUMENTS_PER_WRITER;
/// Writes per writer task (spread over its documents).
const WRITES_PER_WRITER: usize = 14;
const READERS: usize = 3;
/// Large enough for every section of every document: nothing is dropped for the budget.
const BUDGET: u32 = 4_000;

/// Syllables that spell numbers as made-up words (digits would be split off by some analysers).
const SYLLABLES: [&str; 10] = ["ba", "ke", "mi", "no", "pu", "ra", "se", "ti", "vo", "zu"];

fn spelled(mut number: usize) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(SYLLABLES[number % 10]);
        number /= 10;
        if number == 0 {
            break;
        }
    }
    digits.reverse();
    digits.concat()
}

fn doc_id(document: usize) -> String {
    format!("doc{document}")
}

fn document_of(doc_id: &str) -> Option<usize> {
    doc_id.strip_prefix("doc")?.parse().ok()
}

/// The marker word every version of `document` carries.
fn document_word(document: usize) -> String {
    format!("glorf{}x", spelled(document))
}

/// The marker word only `version` of `document` carries.
const VERSION_WORD_PREFIX: &str = "quem";

fn version_word(document: usize, version: u64) -> String {
    format!(
        "{VERSION_WORD_PREFIX}{}q{}x",
        spelled(document),
        spelled(version as usize)
    )
}

/// Version `version` of `document`: three headed sections, all carrying the document's marker and
/// the first two the version's, with non-ASCII text (so byte and char offsets differ) and a length
/// that depends on the version. The closing section is the same in every version: the section
/// cache (keyed by content) serves one analysis for sections at different offsets.
fn version_text(document: usize, version: u64) -> String {
    let word = document_word(document);
    let marker = version_word(document, version);
    // Lengths differ early in each section, so the token offsets of one version do not fit another.
    let filler = format!(
        "The river of nouns flows past {}quiet hills.",
        "very ".repeat(version as usize % 7)
    );
    format!(
        "# Overview of {word} {marker}\n\n\
         {filler} The first part of {word} at version {marker} begins here.\n\n\
         ## Details of {word}\n\n\
         {filler} The second part of {word} says more: café, naïve, über — {marker} again.\n\n\
         ## Closing notes\n\n\
         Last words on {word}, with ünïcödé and 東京 to shift the char offsets.\n"
    )
}

/// The sections of a version's text, as Lathe returns them: from each heading line, trimmed.
fn whole_sections(text: &str) -> Vec<&str> {
    // Every version starts with a heading; every later heading follows a newline.
    let starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices("\n#").map(|(at, _)| at + 1))
        .collect();
    let mut sections = Vec::new();
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(text.len());
        sections.push(text[start..end].trim());
    }
    sections
}

fn version_document(document: usize, version: u64, text: &str) -> proto::Document {
    proto::Document {
        id: doc_id(document),
        title: doc_id(document),
        text: text.to_string(),
        format: Format::Markdown as i32,
        metadata: HashMap::from([("version".to_string(), version.to_string())]),
        ..Default::default()
    }
}

/// One write to one document, in the order its (only) writer issued them.
struct WriteRecord {
    /// The version upserted, or `None` for a delete.
    version: Option<u64>,
    /// The logical time at which the acknowledgement was recorded.
    acknowledged_at: Option<u64>,
}

#[derive(Default)]
struct DocumentHistory {
    /// The full text of every version ever sent, acknowledged or not.
    texts: HashMap<u64, String>,
    writes: Vec<WriteRecord>,
}

/// What the writers did, and a logical clock that orders acknowledgements and query starts.
struct History {
    documents: Vec<Mutex<DocumentHistory>>,
    clock: AtomicU64,
}

impl History {
    fn new() -> Self {
        Self {
            documents: (0..DOCUMENTS).map(|_| Mutex::default()).collect(),
            clock: AtomicU64::new(0),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// Records a write about to be sent; returns its index for [`Self::acknowledge`].
    fn begin_write(&self, document: usize, version: Option<u64>, text: Option<String>) -> usize {
        let mut history = self.documents[document].lock().unwrap();
        if let (Some(version), Some(text)) = (version, text) {
            history.texts.insert(version, text);
        }
        history.writes.push(WriteRecord {
            version,
            acknowledged_at: None,
        });
        history.writes.len() - 1
    }

    /// Stamps the acknowledgement under the document's lock, so that a reader that started later
    /// (a larger tick) and then takes the lock always finds it.
    fn acknowledge(&self, document: usize, write: usize) {
        let mut history = self.documents[document].lock().unwrap();
        let now = self.tick();
        history.writes[write].acknowledged_at = Some(now);
    }

    /// The versions of `document` a query that started at `started` may return: those of the last
    /// write acknowledged before it started and of every later write. Empty when that write was a
    /// delete and nothing was upserted since.
    fn allowed_versions(&self, document: usize, started: u64) -> Vec<u64> {
        let history = self.documents[document].lock().unwrap();
        let first = history
            .writes
            .iter()
            .rposition(|w| w.acknowledged_at.is_some_and(|at| at < started))
            .unwrap_or(0);
        history.writes[first..]
            .iter()
            .filter_map(|w| w.version)
            .collect()
    }

    fn text_of(&self, document: usize, version: u64) -> Option<String> {
        self.documents[document]
            .lock()
            .unwrap()
            .texts
            .get(&version)
            .cloned()
    }
}

/// How the chunks of an answer were cut.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// The default chunking with a budget for everything: sections are smaller than a chunk, so
    /// each chunk is one whole section.
    WholeSections,
    /// Fixed windows of a few tokens under a small budget: each chunk starts and ends on a token
    /// boundary of its own text.
    TokenWindows,
}

const WINDOW_TOKENS: u32 = 8;
const WINDOW_BUDGET: u32 = 40;

/// Checks every chunk of `response` (to a query that started at `started`) against the history:
/// a known document and version, allowed at that time, one version per document, the exact slice
/// of that version at its byte and char offsets, and cut on that version's own tokens (a section
/// analysis of another version's text would cut elsewhere). Returns the version seen per document.
fn check_response(
    history: &History,
    started: u64,
    query: &str,
    shape: Shape,
    response: &proto::RetrieveResponse,
) -> BTreeMap<usize, u64> {
    let mut seen: BTreeMap<usize, u64> = BTreeMap::new();
    for chunk in &response.chunks {
        let context = format!(
            "query `{query}` (cache hit: {}, generation {}), chunk {chunk:?}",
            response.cache_hit, response.generation
        );
        let document = document_of(&chunk.doc_id)
            .filter(|d| *d < DOCUMENTS)
            .unwrap_or_else(|| panic!("unknown document in {context}"));
        let version: u64 = chunk
            .metadata
            .get("version")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no version metadata in {context}"));
        if let Some(earlier) = seen.insert(document, version) {
            assert_eq!(
                earlier, version,
                "one answer mixes versions {earlier} and {version} of one document: {context}"
            );
        }
        let allowed = history.allowed_versions(document, started);
        assert!(
            allowed.contains(&version),
            "stale answer: version {version} returned, but only {allowed:?} were allowed \
             (empty: deleted before the query started): {context}"
        );
        let text = history
            .text_of(document, version)
            .unwrap_or_else(|| panic!("version {version} was never written: {context}"));
        let bytes = chunk.bytes.expect("byte span");
        let chars = chunk.chars.expect("char span");
        assert_eq!(
            text.get(bytes.start as usize..bytes.end as usize),
            Some(chunk.text.as_str()),
            "byte offsets do not slice version {version}: {context}"
        );
        assert_eq!(
            char_slice(&text, chars.start, chars.end),
            chunk.text,
            "char offsets do not slice version {version}: {context}"
        );
        match shape {
            Shape::WholeSections => assert!(
                whole_sections(&text).contains(&chunk.text.as_str()),
                "not a whole section of version {version}: {context}"
            ),
            Shape::TokenWindows => {
                let spans = minilm_token_spans(&text);
                let (start, end) = (bytes.start as usize, bytes.end as usize);
                assert!(
                    spans.iter().any(|s| s.0 == start) && spans.iter().any(|s| s.1 == end),
                    "not cut on the tokens of version {version}: {context}"
                );
                assert!(response.tokens_used <= WINDOW_BUDGET, "{context}");
            }
        }
        // The count is of this text: a section analysis of another text (another version) would
        // cut and count on foreign token offsets.
        assert_eq!(
            chunk.token_count as usize,
            minilm_count(&chunk.text),
            "token count of another text: {context}"
        );
        // The text itself names its version wherever a marker falls inside the chunk (a window
        // may end inside one).
        let expected_marker = version_word(document, version);
        for word in chunk.text.split(|c: char| !c.is_alphanumeric()) {
            if word.starts_with(VERSION_WORD_PREFIX) {
                assert!(
                    expected_marker.starts_with(word),
                    "chunk text of another version: {context}"
                );
            }
        }
    }
    seen
}

/// A request in the `WholeSections` shape.
fn request(query: &str, top_k: u32, doc_ids: Vec<String>) -> proto::RetrieveRequest {
    proto::RetrieveRequest {
        top_k: Some(top_k),
        filter: Some(proto::Filter {
            metadata: Vec::new(),
            doc_ids,
        }),
        ..retrieve_request(COLLECTION, query, BUDGET)
    }
}

/// A request in the `TokenWindows` shape.
fn windows_request(query: &str, top_k: u32) -> proto::RetrieveRequest {
    proto::RetrieveRequest {
        token_budget: WINDOW_BUDGET,
        chunking: Some(proto::ChunkingOptions {
            strategy: proto::ChunkStrategy::Fixed as i32,
            max_tokens: Some(WINDOW_TOKENS),
            ..Default::default()
        }),
        ..request(query, top_k, Vec::new())
    }
}

/// Sends `request` after taking a start time; checks the answer against the history.
async fn checked_retrieve(
    client: &mut LatheClient<Channel>,
    history: &History,
    request: proto::RetrieveRequest,
) -> (proto::RetrieveResponse, BTreeMap<usize, u64>) {
    let query = request.query.clone();
    let fixed = proto::ChunkStrategy::Fixed as i32;
    let shape = match &request.chunking {
        Some(chunking) if chunking.strategy == fixed => Shape::TokenWindows,
        _ => Shape::WholeSections,
    };
    let started = history.tick();
    let response = retrieve(client, request).await;
    let seen = check_response(history, started, &query, shape, &response);
    (response, seen)
}

async fn delete(client: &mut LatheClient<Channel>, document: usize) -> u64 {
    client
        .delete_documents(proto::DeleteDocumentsRequest {
            collection: COLLECTION.to_string(),
            ids: vec![doc_id(document)],
            wait: true,
            write_id: String::new(),
        })
        .await
        .expect("delete")
        .into_inner()
        .generation
}

/// A small deterministic generator (no randomness crate needed, and runs are reproducible).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

/// What a writer did, to show the schedule covers each kind of write.
#[derive(Default)]
struct WriteCounts {
    upserts: u64,
    deletes: u64,
    /// Upserts of an id deleted before.
    upserts_after_delete: u64,
    /// ... whose content is that of the version deleted.
    same_content_upserts: u64,
}

/// Upserts and deletes its own documents with `wait`, checking after each acknowledgement that the
/// next query sees the write, also for a query text asked (and cached) before the write.
async fn writer(
    mut client: LatheClient<Channel>,
    history: Arc<History>,
    writer_index: usize,
) -> WriteCounts {
    let mut counts = WriteCounts::default();
    let mut random = Lcg(writer_index as u64 + 11);
    let owned: Vec<usize> = (0..DOCUMENTS_PER_WRITER)
        .map(|i| writer_index * DOCUMENTS_PER_WRITER + i)
        .collect();
    // Per owned document: the next new version number, and the live version (None: absent).
    let mut next_version = vec![1u64; owned.len()];
    let mut live: Vec<Option<u64>> = vec![None; owned.len()];
    let mut last_upserted: Vec<Option<u64>> = vec![None; owned.len()];
    for _ in 0..WRITES_PER_WRITER {
        let slot = random.next(owned.len() as u64) as usize;
        let document = owned[slot];
        // Before the write, ask the document's own query so its answer is cached at the current
        // generation; after the write the same text must not be answered from that entry.
        checked_retrieve(
            &mut client,
            &history,
            request(&document_word(document), 8, Vec::new()),
        )
        .await;

        let delete_now = live[slot].is_some() && random.next(3) == 0;
        if delete_now {
            let write = history.begin_write(document, None, None);
            let generation = delete(&mut client, document).await;
            history.acknowledge(document, write);
            live[slot] = None;
            counts.deletes += 1;
            for filter in [Vec::new(), vec![doc_id(document)]] {
                let (response, seen) = checked_retrieve(
                    &mut client,
                    &history,
                    request(&document_word(document), 8, filter),
                )
                .await;
                assert!(
                    !seen.contains_key(&document),
                    "read-your-writes: doc{document} answered after its delete was acknowledged"
                );
                assert!(response.generation >= generation);
            }
            continue;
        }
        // After a delete, sometimes re-upsert the very same content (same content hash, same
        // section keys) rather than a new version.
        counts.upserts += 1;
        if live[slot].is_none() && last_upserted[slot].is_some() {
            counts.upserts_after_delete += 1;
        }
        let version = match (live[slot], last_upserted[slot]) {
            (None, Some(previous)) if random.next(2) == 0 => {
                counts.same_content_upserts += 1;
                previous
            }
            _ => {
                next_version[slot] += 1;
                next_version[slot] - 1
            }
        };
        let text = version_text(document, version);
        let write = history.begin_write(document, Some(version), Some(text.clone()));
        let written = upsert(
            &mut client,
            COLLECTION,
            vec![version_document(document, version, &text)],
        )
        .await;
        history.acknowledge(document, write);
        assert_eq!(written.sections, 3, "three headed sections");
        live[slot] = Some(version);
        last_upserted[slot] = Some(version);

        // Read-your-writes, by the version's own marker and by the document's marker (a text
        // already asked, and cached, before the write).
        for query in [version_word(document, version), document_word(document)] {
            let (response, seen) =
                checked_retrieve(&mut client, &history, request(&query, 8, Vec::new())).await;
            assert_eq!(
                seen.get(&document),
                Some(&version),
                "read-your-writes: query `{query}` after the acknowledged upsert of doc{document} \
                 version {version} (generation {}) answered {seen:?} at generation {} \
                 (cache hit: {})",
                written.generation,
                response.generation,
                response.cache_hit
            );
            assert!(response.generation >= written.generation);
        }
    }
    counts
}

/// Queries in a loop while the writers work, each text twice in a row so that cached answers are
/// checked too, and one pair more once they are done: however fast the writers finish, every
/// reader checks answers, and a cached one. Returns (answers, chunks checked, cache hits).
async fn reader(
    mut client: LatheClient<Channel>,
    history: Arc<History>,
    reader_index: usize,
    writers_done: Arc<AtomicBool>,
) -> (u64, u64, u64) {
    let mut random = Lcg(reader_index as u64 + 101);
    let every_document: String = (0..DOCUMENTS)
        .map(document_word)
        .collect::<Vec<_>>()
        .join(" ");
    let (mut answers, mut chunks, mut hits) = (0, 0, 0);
    let mut last_round = false;
    loop {
        if writers_done.load(Ordering::SeqCst) {
            if last_round {
                break;
            }
            last_round = true;
        }
        let document = random.next(DOCUMENTS as u64) as usize;
        let query = match random.next(3) {
            _ if last_round => every_document.clone(),
            0 => every_document.clone(),
            1 => document_word(document),
            // A version that exists now or soon: the newest written, or an older one.
            _ => {
                let newest = history.documents[document]
                    .lock()
                    .unwrap()
                    .texts
                    .keys()
                    .max()
                    .copied()
                    .unwrap_or(1);
                version_word(document, random.next(newest) + 1)
            }
        };
        let top_k = 3 * DOCUMENTS as u32;
        let windows = random.next(2) == 0 && !last_round;
        for _ in 0..2 {
            let request = if windows {
                windows_request(&query, top_k)
            } else {
                request(&query, top_k, Vec::new())
            };
            let (response, _) = checked_retrieve(&mut client, &history, request).await;
            answers += 1;
            chunks += response.chunks.len() as u64;
            hits += u64::from(response.cache_hit);
        }
    }
    (answers, chunks, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_and_reads_stay_fresh_and_consistent() {
    Fixture::new()
        .collection(COLLECTION)
        .run(|Served { mut client, .. }| async move {
            let history = Arc::new(History::new());
            let writers_done = Arc::new(AtomicBool::new(false));

            let readers: Vec<_> = (0..READERS)
                .map(|i| {
                    tokio::spawn(reader(
                        client.clone(),
                        Arc::clone(&history),
                        i,
                        Arc::clone(&writers_done),
                    ))
                })
                .collect();
            let writers: Vec<_> = (0..WRITERS)
                .map(|i| tokio::spawn(writer(client.clone(), Arc::clone(&history), i)))
                .collect();
            let mut writer_failure = None;
            let mut counts = WriteCounts::default();
            for writer in writers {
                match writer.await {
                    Ok(done) => {
                        counts.upserts += done.upserts;
                        counts.deletes += done.deletes;
                        counts.upserts_after_delete += done.upserts_after_delete;
                        counts.same_content_upserts += done.same_content_upserts;
                    }
                    Err(error) => {
                        writer_failure.get_or_insert(error);
                    }
                }
            }
            writers_done.store(true, Ordering::SeqCst);
            let (mut answers, mut chunks, mut hits) = (0, 0, 0);
            for reader in readers {
                let (a, c, h) = reader.await.expect("reader");
                (answers, chunks, hits) = (answers + a, chunks + c, hits + h);
            }
            if let Some(error) = writer_failure {
                std::panic::resume_unwind(error.into_panic());
            }
            eprintln!(
                "writers: {} upserts ({} after a delete, {} of the deleted content), {} deletes; \
         readers: {answers} answers, {chunks} chunks checked, {hits} cache hits",
                counts.upserts,
                counts.upserts_after_delete,
                counts.same_content_upserts,
                counts.deletes
            );
            // The schedule is deterministic; these say it covers every kind of write.
            assert!(counts.deletes > 0 && counts.upserts_after_delete > 0);
            assert!(counts.same_content_upserts > 0);
            assert!(chunks > 0, "the readers checked no chunk at all");
            assert!(hits > 0, "no cached answer was checked");

            // Finally every document is as its last acknowledged write left it.
            for document in 0..DOCUMENTS {
                let (_, seen) = checked_retrieve(
                    &mut client,
                    &history,
                    request(&document_word(document), 8, vec![doc_id(document)]),
                )
                .await;
                let last = history.documents[document]
                    .lock()
                    .unwrap()
                    .writes
                    .last()
                    .and_then(|w| w.version);
                assert_eq!(seen.get(&document).copied(), last, "doc{document}");
            }
        })
        .await;
}

/// The same query text before and after each write, step by step: the result cache answers a
/// repeated query, and a write (upsert, delete, re-upsert of an earlier content) always moves it
/// to a fresh answer of the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_cache_is_keyed_by_generation_and_never_stale() {
    Fixture::new()
        .collection(COLLECTION)
        .run(|Served { mut client, .. }| async move {
            let history = History::new();
            let document = 0;
            let query = document_word(document);

            // Asks `query` twice: the first answer is computed, the second comes from the cache and is
            // the same. Returns the first and the versions of `document` seen.
            async fn ask_twice(
                client: &mut LatheClient<Channel>,
                history: &History,
                query: &str,
            ) -> (proto::RetrieveResponse, Option<u64>) {
                let (first, seen) =
                    checked_retrieve(client, history, request(query, 8, Vec::new())).await;
                assert!(!first.cache_hit, "the first answer after a write is fresh");
                let (again, seen_again) =
                    checked_retrieve(client, history, request(query, 8, Vec::new())).await;
                assert!(
                    again.cache_hit,
                    "the repeated query is answered by the cache"
                );
                assert_eq!(again.generation, first.generation);
                assert_eq!(again.chunks, first.chunks);
                assert_eq!(seen_again, seen);
                (first, seen.get(&0).copied())
            }

            async fn upsert_version(
                client: &mut LatheClient<Channel>,
                history: &History,
                version: u64,
            ) -> u64 {
                let text = version_text(0, version);
                let write = history.begin_write(0, Some(version), Some(text.clone()));
                let written = upsert(
                    client,
                    COLLECTION,
                    vec![version_document(0, version, &text)],
                )
                .await;
                history.acknowledge(0, write);
                written.generation
            }

            let generation_1 = upsert_version(&mut client, &history, 1).await;
            let (answer, version) = ask_twice(&mut client, &history, &query).await;
            assert_eq!((answer.generation, version), (generation_1, Some(1)));
            assert_eq!(answer.chunks.len(), 3, "every section of version 1");

            let generation_2 = upsert_version(&mut client, &history, 2).await;
            assert!(generation_2 > generation_1);
            let (answer, version) = ask_twice(&mut client, &history, &query).await;
            assert_eq!((answer.generation, version), (generation_2, Some(2)));

            let write = history.begin_write(document, None, None);
            let generation_3 = delete(&mut client, document).await;
            history.acknowledge(document, write);
            let (answer, version) = ask_twice(&mut client, &history, &query).await;
            assert_eq!((answer.generation, version), (generation_3, None));

            // The very content of version 1 again: same content hash, same section keys, same section
            // cache entries; only the generation tells the cached answer of generation 1 from this one.
            let generation_4 = upsert_version(&mut client, &history, 1).await;
            let (answer, version) = ask_twice(&mut client, &history, &query).await;
            assert_eq!((answer.generation, version), (generation_4, Some(1)));
            assert_eq!(answer.chunks.len(), 3);

            // Version 5 keeps the closing section's text word for word (a section cache hit) but moves it
            // (a shorter first section): its offsets must be those of version 5 (checked on every chunk).
            let generation_5 = upsert_version(&mut client, &history, 5).await;
            let (answer, version) = ask_twice(&mut client, &history, &query).await;
            assert_eq!((answer.generation, version), (generation_5, Some(5)));
            let closing = answer
                .chunks
                .iter()
                .find(|c| c.heading_path.last().map(String::as_str) == Some("Closing notes"))
                .expect("the closing section");
            let moved_from = version_text(0, 1).find("## Closing notes").unwrap();
            let moved_to = version_text(0, 5).find("## Closing notes").unwrap();
            assert_ne!(moved_from, moved_to);
            assert!(closing.bytes.unwrap().start as usize >= moved_to);
        })
        .await;
}

/// A deleted document's section vectors leave the dense index with it. Before the fix a delete
/// removed the sections from tantivy only: their vectors stayed live in hnsw, so the nearest
/// neighbours of a query could all be deleted sections (dropped by the tantivy lookup), leaving
/// the dense leg empty, and they never counted towards compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_documents_leave_the_dense_index() {
    let query = "volcano eruption lava";
    // Near copies of the query, nearer to it than anything kept.
    let deleted: Vec<String> = (0..12).map(|i| format!("gone{i}")).collect();
    let near_copies = deleted
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let text = format!("Volcano eruption lava. Volcano eruption lava number {i}.");
            document(id, &text, Format::Plain)
        })
        .collect();
    Fixture::new()
        .collection(COLLECTION)
        .documents(near_copies)
        .run(|Served { mut client, .. }| async move {
            // Related in meaning, but sharing no term with the query: only the dense leg finds it.
            let kept =
                "Molten rock climbs through vents in the crust and spills down the mountain.";
            upsert(
                &mut client,
                COLLECTION,
                vec![document("kept", kept, Format::Plain)],
            )
            .await;
            let before = retrieve(&mut client, retrieve_request(COLLECTION, query, 256)).await;
            assert!(before.chunks.iter().any(|c| c.doc_id.starts_with("gone")));

            client
                .delete_documents(proto::DeleteDocumentsRequest {
                    collection: COLLECTION.to_string(),
                    ids: deleted.clone(),
                    wait: true,
                    write_id: String::new(),
                })
                .await
                .expect("delete");
            for top_k in [1, 4] {
                let mut request = retrieve_request(COLLECTION, query, 256);
                request.top_k = Some(top_k);
                let after = retrieve(&mut client, request).await;
                let ids: Vec<&str> = after.chunks.iter().map(|c| c.doc_id.as_str()).collect();
                assert_eq!(
                    ids,
                    vec!["kept"],
                    "top_k {top_k}: the only live document is the dense leg's nearest"
                );
                assert_eq!(after.chunks[0].text, kept);
            }
        })
        .await;
}
