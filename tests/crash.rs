//! Crash safety: 20 rounds of `lathe serve` (the real binary) taking upserts and deletes with
//! `wait`, killed with SIGKILL at a random moment, restarted and checked: every acknowledged
//! upsert is there with its latest content, every acknowledged delete is gone, no document is
//! half-applied (all of its sections present and from one version), the lexical and dense indexes
//! agree, and the server answers. A second test does the same for the persisted dense index
//! (static vectors, segments sealed every few writes): after SIGKILL the sealed segments are
//! loaded, only what came after the last seal is inserted again, the lexical and dense indexes
//! agree, and a dense search finds the last acknowledged write.

mod common;

use std::collections::HashMap;
use std::process::Child;
use std::time::Duration;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe::embed::{Embedder, StaticEmbedder};
use lathe::index::CollectionIndex;
use lathe::types::Filter;

const ROUNDS: usize = 20;
const DOCUMENTS: usize = 12;
const SECTIONS: u64 = 3;

/// What the client knows for sure about one document.
#[derive(Clone, Debug, PartialEq)]
enum Known {
    Absent,
    /// Present with the content of this write sequence number.
    Present(u64),
}

struct Server {
    child: Child,
    client: LatheClient<tonic::transport::Channel>,
    metrics_address: String,
}

async fn start(data_dir: &std::path::Path) -> Server {
    let server = binary::start(data_dir, &[]);
    let mut client = binary::connect(&server.address).await;
    // What was queued before a kill is applied after the restart: settle it before checking.
    drain_queue(&mut client, "c").await;
    Server {
        child: server.child,
        client,
        metrics_address: server.metrics_address,
    }
}

fn document_text(doc: usize, sequence: u64) -> (String, Vec<proto::SectionBoundary>) {
    let mut text = String::new();
    let mut sections = Vec::new();
    for part in 0..SECTIONS {
        let start = text.chars().count() as u64;
        text.push_str(&format!("Part {part} of doc{doc}: marker{sequence} and some steady words about the subject.\n\n"));
        sections.push(proto::SectionBoundary {
            start,
            end: text.chars().count() as u64 - 2,
            title: format!("part {part}"),
        });
    }
    (text, sections)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill_and_nothing_is_half_applied() {
    let dir = tempfile::tempdir().unwrap();
    let mut known: HashMap<usize, Known> = (0..DOCUMENTS).map(|d| (d, Known::Absent)).collect();
    let mut sequence = 0u64;
    let mut seed = 0x5eed_u64;
    let mut next_random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut acknowledged_total = 0;
    for round in 0..ROUNDS {
        let mut server = start(dir.path()).await;
        if round == 0 {
            create_collection(&mut server.client, "c").await;
        }
        // Check everything acknowledged so far before writing more.
        verify(&mut server.client, dir.path(), &known, None, round).await;

        // Write until killed at a random moment.
        let kill_after = Duration::from_millis(50 + next_random() % 600);
        let started = std::time::Instant::now();
        while started.elapsed() < kill_after {
            let doc = (next_random() % DOCUMENTS as u64) as usize;
            sequence += 1;
            let intended = if next_random() % 4 == 0 {
                Known::Absent
            } else {
                Known::Present(sequence)
            };
            let result = match &intended {
                Known::Absent => server
                    .client
                    .delete_documents(proto::DeleteDocumentsRequest {
                        collection: "c".into(),
                        ids: vec![format!("doc{doc}")],
                        wait: true,
                        write_id: String::new(),
                    })
                    .await
                    .map(|_| ()),
                Known::Present(sequence) => {
                    let (text, sections) = document_text(doc, *sequence);
                    let mut document =
                        document(&format!("doc{doc}"), &text, proto::DocumentFormat::Plain);
                    document.sections = sections;
                    server
                        .client
                        .upsert_documents(proto::UpsertDocumentsRequest {
                            collection: "c".into(),
                            documents: vec![document],
                            wait: true,
                            write_id: String::new(),
                        })
                        .await
                        .map(|_| ())
                }
            };
            result.expect("write acknowledged");
            known.insert(doc, intended);
            acknowledged_total += 1;
        }
        // One more write, in flight by construction when the server is killed: an upload that
        // sends the document and keeps its stream open, so the call cannot end (nor be
        // acknowledged); the kill comes at a random moment after the server has admitted it,
        // while the batch may be anywhere between arriving and being committed.
        let doc = (next_random() % DOCUMENTS as u64) as usize;
        sequence += 1;
        let (text, sections) = document_text(doc, sequence);
        let mut pending = document(&format!("doc{doc}"), &text, proto::DocumentFormat::Plain);
        pending.sections = sections;
        let (batches, receiver) = tokio::sync::mpsc::channel(1);
        batches
            .send(proto::UpsertDocumentsRequest {
                collection: "c".into(),
                documents: vec![pending],
                wait: true,
                write_id: String::new(),
            })
            .await
            .unwrap();
        let mut client = server.client.clone();
        let pending_write = tokio::spawn(async move {
            client
                .upload_documents(tokio_stream::wrappers::ReceiverStream::new(receiver))
                .await
        });
        while binary::requests_in_flight(&server.metrics_address) < 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(next_random() % 5)).await;
        server.child.kill().expect("SIGKILL");
        let _ = server.child.wait();
        assert!(
            pending_write.await.unwrap().is_err(),
            "an upload whose stream never ended cannot be acknowledged"
        );
        drop(batches);
        let in_flight = (doc, Known::Present(sequence));
        // The next round's verify allows the unacknowledged write to have landed or not.
        let mut server = start(dir.path()).await;
        verify(
            &mut server.client,
            dir.path(),
            &known,
            Some(&in_flight),
            round,
        )
        .await;
        // Settle the doubt so later rounds compare against one truth.
        known.insert(doc, current_state(&mut server.client, doc).await);
        server.child.kill().unwrap();
        let _ = server.child.wait();
    }
    assert!(
        acknowledged_total > ROUNDS,
        "the test must actually write: {acknowledged_total} acknowledged writes"
    );
}

async fn current_state(client: &mut LatheClient<tonic::transport::Channel>, doc: usize) -> Known {
    let mut request = retrieve_request("c", &format!("doc{doc} marker"), 4096);
    request.filter = Some(proto::Filter {
        metadata: vec![],
        doc_ids: vec![format!("doc{doc}")],
    });
    let response = retrieve(client, request).await;
    match response.chunks.first() {
        None => Known::Absent,
        Some(chunk) => {
            let marker = chunk.text.split("marker").nth(1).unwrap_or_default();
            Known::Present(
                marker
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .unwrap_or(0),
            )
        }
    }
}

async fn verify(
    client: &mut LatheClient<tonic::transport::Channel>,
    data_dir: &std::path::Path,
    known: &HashMap<usize, Known>,
    doubtful: Option<&(usize, Known)>,
    round: usize,
) {
    for (&doc, expected) in known {
        let state = current_state(client, doc).await;
        let allowed_doubt = doubtful.is_some_and(|(d, intended)| *d == doc && *intended == state);
        assert!(
            state == *expected || allowed_doubt,
            "round {round}: doc{doc} is {state:?}, acknowledged {expected:?}"
        );
    }
    // The dense index holds a vector for every visible section and no other.
    let stats = collection_stats(client, "c").await;
    let dense = stats
        .dense
        .expect("the default server runs the dense stage");
    assert_eq!(
        (dense.vectors, dense.sections_with_vector),
        (stats.sections, stats.sections),
        "round {round}: lexical and dense indexes disagree: {stats:?}"
    );
    // Every document whole: all of its sections, all from one version (read from the index files).
    let index_path = data_dir.join("collections/c/index");
    let reader_dir = tempfile::tempdir().unwrap();
    copy_dir(&index_path, reader_dir.path());
    let index = CollectionIndex::open_or_create(
        reader_dir.path(),
        15 << 20,
        Duration::from_secs(3600),
        None,
    )
    .expect("open index copy");
    for doc in 0..DOCUMENTS {
        let sections = index.document_sections(&format!("doc{doc}")).unwrap();
        if sections.is_empty() {
            continue;
        }
        let ordinals: Vec<u64> = sections.iter().map(|s| s.0).collect();
        assert_eq!(
            ordinals,
            (0..SECTIONS).collect::<Vec<_>>(),
            "round {round}: doc{doc} sections {sections:?}"
        );
        assert!(
            sections.iter().all(|s| s.1 == sections[0].1),
            "round {round}: doc{doc} mixes versions {sections:?}"
        );
    }
}

/// Copies the files of `from` (a live server's folder: a commit may remove a file while it is
/// copied, and then the whole copy is made again).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for _ in 0..10 {
        let copied = std::fs::read_dir(from).unwrap().try_for_each(|entry| {
            let entry = entry?;
            if entry.file_type()?.is_file() && entry.file_name() != ".tantivy-writer.lock" {
                std::fs::copy(entry.path(), to.join(entry.file_name()))?;
            }
            Ok::<(), std::io::Error>(())
        });
        match copied {
            Ok(()) => return,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                for entry in std::fs::read_dir(to).unwrap() {
                    std::fs::remove_file(entry.unwrap().path()).unwrap();
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(error) => panic!("copying {}: {error}", from.display()),
        }
    }
    panic!("{} kept changing while it was copied", from.display());
}

/// Rounds of the dense test, and its live segment's size: sealed after every few documents.
const DENSE_ROUNDS: usize = 6;
const DENSE_SEAL_VECTORS: usize = 7;

/// Words the dense test's documents are drawn from: each document's static vector is its own.
const WORDS: [&str; 48] = [
    "harbour", "glacier", "violin", "tractor", "pepper", "comet", "lantern", "falcon", "quartz",
    "meadow", "ledger", "canyon", "saddle", "orchid", "furnace", "pigeon", "mosaic", "tundra",
    "cactus", "anchor", "biscuit", "thunder", "compass", "walrus", "marble", "kettle", "volcano",
    "lobster", "parsley", "turbine", "whistle", "blanket", "crater", "dolphin", "emerald",
    "feather", "granite", "hammock", "igloo", "jasmine", "kayak", "lemon", "magnet", "nectar",
    "oyster", "pyramid", "quiver", "raven",
];

/// The field `name` of the server's "dense index opened" log line.
fn dense_open_field(startup_log: &[String], name: &str) -> u64 {
    let line = startup_log
        .iter()
        .find(|line| line.contains("dense index opened"))
        .unwrap_or_else(|| panic!("no dense open line in {startup_log:?}"));
    let value = line
        .split(&format!("\"{name}\":"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in {line}"));
    value
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_persisted_dense_index_agrees_with_lexical_after_sigkill_and_finds_late_writes() {
    let dir = tempfile::tempdir().unwrap();
    let variables = [
        ("LATHE_MODELS__DENSE", "static".to_string()),
        ("LATHE_DENSE__SEAL_VECTORS", DENSE_SEAL_VECTORS.to_string()),
    ];
    let embedder = StaticEmbedder::from_models_dir(&models_dir()).expect("static vectors load");
    let mut seed = 0xdeu64;
    let mut next_random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut loaded_segments_seen, mut replayed_seen) = (0, 0);
    let mut open_lines = Vec::new();
    let mut written = 0u64;
    for round in 0..DENSE_ROUNDS {
        let mut server = start_with(dir.path(), &variables).await;
        if round == 0 {
            create_collection(&mut server.client, "d").await;
        } else {
            open_lines.extend(
                server
                    .startup_log
                    .iter()
                    .filter(|line| line.contains("dense index opened"))
                    .cloned(),
            );
            loaded_segments_seen += dense_open_field(&server.startup_log, "loaded_segments");
            replayed_seen += dense_open_field(&server.startup_log, "replayed");
            assert_eq!(
                dense_open_field(&server.startup_log, "damaged_segments"),
                0,
                "round {round}"
            );
        }
        // Acknowledged upserts (and some deletes) for a random while, then SIGKILL.
        let kill_after = Duration::from_millis(150 + next_random() % 400);
        let started = std::time::Instant::now();
        let mut last: Option<(String, String)> = None;
        // At least a few upserts a round however slow the machine, and not a whole number of
        // segments: some are sealed, some still in the live segment at the kill.
        let mut upserts = 0;
        while last.is_none() || upserts < DENSE_SEAL_VECTORS + 3 || started.elapsed() < kill_after {
            written += 1;
            let doc_id = format!("doc{}", next_random() % 30);
            if next_random() % 5 == 0 {
                server
                    .client
                    .delete_documents(proto::DeleteDocumentsRequest {
                        collection: "d".into(),
                        ids: vec![doc_id.clone()],
                        wait: true,
                        write_id: String::new(),
                    })
                    .await
                    .expect("delete acknowledged");
                if last.as_ref().is_some_and(|(id, _)| *id == doc_id) {
                    last = None;
                }
                continue;
            }
            let text: Vec<&str> = (0..8)
                .map(|_| WORDS[(next_random() % WORDS.len() as u64) as usize])
                .collect();
            let text = format!("{} {written}", text.join(" "));
            upsert(
                &mut server.client,
                "d",
                vec![document(&doc_id, &text, proto::DocumentFormat::Plain)],
            )
            .await;
            last = Some((doc_id, text));
            upserts += 1;
        }
        server.child.kill().expect("SIGKILL");
        let _ = server.child.wait();
        let (last_id, last_text) = last.expect("one upsert acknowledged");

        // The killed server's files, opened as the server opens them.
        let copy = tempfile::tempdir().unwrap();
        let collection = dir.path().join("collections/d");
        for folder in ["index", "dense"] {
            std::fs::create_dir_all(copy.path().join(folder)).unwrap();
            if collection.join(folder).exists() {
                copy_dir(&collection.join(folder), &copy.path().join(folder));
            }
        }
        let index = CollectionIndex::open_or_create(
            &copy.path().join("index"),
            15 << 20,
            Duration::from_secs(3600),
            Some(embedder.dim()),
        )
        .expect("open the copy");
        let stats = index.stats().unwrap();
        let dense = stats.dense.unwrap();
        assert_eq!(
            (dense.vectors, dense.sections_with_vector),
            (stats.sections, stats.sections),
            "round {round}: lexical and dense indexes disagree: {stats:?}"
        );
        // The last acknowledged write is found by the dense index alone.
        let query = embedder.embed_query(&last_text).unwrap();
        let hits = index
            .search_dense(&index.snapshot(), &query, &Filter::default(), 1)
            .unwrap();
        assert_eq!(hits[0].doc_id, last_id, "round {round}: {hits:?}");
        drop(index);

        // The restarted server agrees too.
        let mut server = start_with(dir.path(), &variables).await;
        let stats = collection_stats(&mut server.client, "d").await;
        let dense = stats.dense.expect("the dense stage runs");
        assert_eq!(
            (dense.vectors, dense.sections_with_vector),
            (stats.sections, stats.sections),
            "round {round}: the restarted server's indexes disagree: {stats:?}"
        );
        server.child.kill().unwrap();
        let _ = server.child.wait();
    }
    // Sealed segments were loaded rather than rebuilt, and writes after the last seal replayed.
    assert!(
        loaded_segments_seen > 0,
        "no sealed segment was ever loaded: {open_lines:#?}"
    );
    assert!(
        replayed_seen > 0,
        "no write after a seal was ever replayed: {open_lines:#?}"
    );
}

/// [`start`] with `variables`, keeping the startup log.
struct LoggedServer {
    child: Child,
    client: LatheClient<tonic::transport::Channel>,
    startup_log: Vec<String>,
}

async fn start_with(data_dir: &std::path::Path, variables: &[(&str, String)]) -> LoggedServer {
    let server = binary::start(data_dir, variables);
    let mut client = binary::connect(&server.address).await;
    drain_queue(&mut client, "d").await;
    LoggedServer {
        child: server.child,
        client,
        startup_log: server.startup_log,
    }
}
