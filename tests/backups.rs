//! Snapshots and restores on the real `lathe serve` binary (static vectors, dense segments sealed
//! every 40 vectors, so a snapshot holds sealed segments and vectors only tantivy holds):
//! - a snapshot taken while a writer and 4 readers run, restored on a second server, answers
//!   every query byte for byte as the source did at the snapshot's generation;
//! - a snapshot with one flipped byte, or cut short, is refused naming its file (by the API and by
//!   `lathe restore`), and nothing is created;
//! - snapshots are listed, outlive their collection, restore from the server's own folder and
//!   are deleted.
//!
//! `LATHE_TEST_BIN=/path/to/lathe cargo test --test backups` runs them against another build.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::binary::{self, Server};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;
use tonic::Code;

type Client = LatheClient<Channel>;

const QUERIES: [&str; 8] = [
    "river granite lantern",
    "orchard voltage",
    "harbor meadow cipher",
    "falcon quarry",
    "saddle thimble walnut",
    "zephyr beacon",
    "copper river",
    "lantern falcon walnut",
];

fn variables() -> Vec<(&'static str, String)> {
    vec![
        ("LATHE_MODELS__DENSE", "static".to_string()),
        ("LATHE_DENSE__SEAL_VECTORS", "40".to_string()),
    ]
}

async fn start(data_dir: &Path) -> (Server, Client) {
    start_with(data_dir, variables()).await
}

async fn start_with(data_dir: &Path, variables: Vec<(&'static str, String)>) -> (Server, Client) {
    let server = binary::start(data_dir, &variables);
    let client = binary::connect(&server.address).await;
    (server, client)
}

/// What a Retrieve answered, without what depends on the moment (timings, the cache).
#[derive(Clone, Debug, PartialEq)]
struct Answer {
    generation: u64,
    tokens_used: u32,
    chunks: Vec<proto::RetrievedChunk>,
}

async fn ask(client: &mut Client, collection: &str, query: &str) -> Answer {
    let response = retrieve(client, retrieve_request(collection, query, 300)).await;
    Answer {
        generation: response.generation,
        tokens_used: response.tokens_used,
        chunks: response.chunks,
    }
}

async fn take_snapshot(client: &mut Client, collection: &str) -> proto::SnapshotInfo {
    client
        .create_snapshot(proto::CreateSnapshotRequest {
            collection: collection.into(),
        })
        .await
        .expect("create snapshot")
        .into_inner()
}

async fn download(client: &mut Client, snapshot: &proto::SnapshotInfo) -> Vec<u8> {
    let mut stream = client
        .download_snapshot(proto::DownloadSnapshotRequest {
            collection: snapshot.collection.clone(),
            name: snapshot.name.clone(),
        })
        .await
        .expect("download")
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.message().await.expect("a chunk") {
        bytes.extend(chunk.data);
    }
    bytes
}

async fn upload(
    client: &mut Client,
    collection: &str,
    bytes: &[u8],
) -> Result<tonic::Response<proto::RestoreSnapshotResponse>, tonic::Status> {
    let mut messages: Vec<proto::RestoreSnapshotRequest> = bytes
        .chunks(256 << 10)
        .map(|data| proto::RestoreSnapshotRequest {
            data: data.to_vec(),
            ..Default::default()
        })
        .collect();
    messages[0].collection = collection.to_string();
    client.restore_snapshot(tokio_stream::iter(messages)).await
}

/// `lathe ARGS` run to its end: its output, or what it printed on failure.
fn cli(args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(binary::lathe_binary())
        .args(args)
        .output()
        .expect("run lathe");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        Err(text(&output.stderr))
    }
}

async fn collection_names(client: &mut Client) -> Vec<String> {
    let listed = client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .expect("list")
        .into_inner();
    listed.collections.into_iter().map(|c| c.name).collect()
}

/// Every distinct answer seen per (generation, query). One generation may answer in two ways:
/// a merge that purges deleted sections commits no new generation (tantivy keeps the opstamp), yet
/// changes BM25's corpus statistics, so scores move in their last digits.
type Seen = Arc<Mutex<HashMap<(u64, usize), Vec<Answer>>>>;

fn record(seen: &Seen, query: usize, answer: Answer) {
    let mut seen = seen.lock().unwrap();
    let answers = seen.entry((answer.generation, query)).or_default();
    if !answers.contains(&answer) {
        answers.push(answer);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_taken_under_writes_and_reads_restores_elsewhere_answering_as_the_source_did() {
    let dir = tempfile::tempdir().unwrap();
    tokio::time::timeout(TEST_LIMIT, async {
        // No result cache at the source: every answer recorded is the live index's at its
        // generation, including after a merge that changes the scores but not the generation.
        let mut uncached = variables();
        uncached.push(("LATHE_CACHE__RESULT_BYTES", "0".to_string()));
        let (source, mut client) = start_with(&dir.path().join("a"), uncached).await;
        create_collection(&mut client, "docs").await;
        let first: Vec<_> = (0..60).map(sectioned_document).collect();
        upsert(&mut client, "docs", first).await;
        // Deletes and a replaced version: the snapshot holds tantivy's delete files and dead
        // dense slots too.
        client
            .delete_documents(proto::DeleteDocumentsRequest {
                collection: "docs".into(),
                ids: vec!["doc5".into(), "doc6".into()],
                wait: true,
                ..Default::default()
            })
            .await
            .expect("delete");
        let mut replaced = sectioned_document(9);
        replaced.text = sectioned_document(23).text;
        upsert(&mut client, "docs", vec![replaced]).await;

        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let seen: Seen = Arc::default();
        let writer = tokio::spawn({
            let (mut client, stop, paused) = (client.clone(), stop.clone(), paused.clone());
            async move {
                let mut next = 60;
                while !stop.load(Ordering::SeqCst) {
                    if !paused.load(Ordering::SeqCst) {
                        upsert(&mut client, "docs", vec![sectioned_document(next)]).await;
                        next += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                next - 60
            }
        });
        let readers: Vec<_> = (0..4)
            .map(|reader| {
                let (mut client, stop, seen) = (client.clone(), stop.clone(), seen.clone());
                tokio::spawn(async move {
                    let mut i = reader;
                    while !stop.load(Ordering::SeqCst) {
                        let query = i % QUERIES.len();
                        let answer = ask(&mut client, "docs", QUERIES[query]).await;
                        record(&seen, query, answer);
                        i += 1;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let snapshot = take_snapshot(&mut client, "docs").await;
        // The writer stops after its write under way; if none landed since the snapshot, its
        // generation is still the one shown, and every query is asked at it once more.
        paused.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (query, text) in QUERIES.iter().enumerate() {
            let answer = ask(&mut client, "docs", text).await;
            if answer.generation == snapshot.generation {
                record(&seen, query, answer);
            }
        }
        paused.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.store(true, Ordering::SeqCst);
        let written = writer.await.unwrap();
        for reader in readers {
            reader.await.unwrap();
        }
        assert!(
            written >= 4,
            "the writer wrote {written} documents meanwhile"
        );
        let bytes = download(&mut client, &snapshot).await;
        assert_eq!(bytes.len() as u64, snapshot.bytes);
        // It holds sealed dense segments, so both halves of a restore's dense index are tested:
        // segments loaded from the snapshot, and vectors inserted from the stored sections.
        let mut archive = tar::Archive::new(&bytes[..]);
        let sealed = archive
            .entries()
            .unwrap()
            .filter(|entry| {
                let path = entry
                    .as_ref()
                    .unwrap()
                    .path()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                path.starts_with("dense/seg-") && path.ends_with(".keys")
            })
            .count();
        assert!(
            sealed >= 1,
            "{sealed} sealed dense segments in the snapshot"
        );
        eprintln!("{sealed} sealed dense segments, {written} documents written meanwhile");
        binary::stop(source);

        let (target, mut client) = start(&dir.path().join("b")).await;
        let restored = upload(&mut client, "restored", &bytes)
            .await
            .expect("restore")
            .into_inner();
        assert_eq!(restored.source_collection, "docs");
        assert_eq!(restored.generation, snapshot.generation);
        let seen = seen.lock().unwrap().clone();
        for (query, text) in QUERIES.iter().enumerate() {
            let expected = seen.get(&(snapshot.generation, query)).unwrap_or_else(|| {
                panic!(
                    "no reader saw query {query} at generation {}",
                    snapshot.generation
                )
            });
            let answer = ask(&mut client, "restored", text).await;
            assert!(!answer.chunks.is_empty(), "query {query} found nothing");
            assert!(
                expected.contains(&answer),
                "query {query} (`{text}`): the restored collection answered\n{answer:?}\n\
                 the source answered at that generation\n{expected:?}"
            );
        }
        binary::stop(target);
    })
    .await
    .expect("within the test limit");
}

/// Where the bytes of the archive's file `path` lie in `archive`.
fn file_range(archive: &[u8], path: &str) -> std::ops::Range<usize> {
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().unwrap() {
        let entry = entry.unwrap();
        if entry.path().unwrap().to_str() == Some(path) {
            let start = entry.raw_file_position() as usize;
            return start..start + entry.size() as usize;
        }
    }
    panic!("{path} is not in the snapshot")
}

fn store_file(archive: &[u8]) -> String {
    let mut reader = tar::Archive::new(archive);
    let names: Vec<String> = reader
        .entries()
        .unwrap()
        .map(|entry| {
            entry
                .unwrap()
                .path()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names
        .into_iter()
        .find(|name| name.starts_with("index/") && name.ends_with(".store"))
        .expect("a doc store in the snapshot")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_cut_short_snapshot_is_refused_naming_its_file_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    tokio::time::timeout(TEST_LIMIT, async {
        let (server, mut client) = start(&dir.path().join("data")).await;
        create_collection(&mut client, "docs").await;
        upsert(
            &mut client,
            "docs",
            (0..50).map(sectioned_document).collect(),
        )
        .await;
        let snapshot = take_snapshot(&mut client, "docs").await;
        let whole = download(&mut client, &snapshot).await;

        let store = store_file(&whole);
        let mut flipped = whole.clone();
        let range = file_range(&whole, &store);
        flipped[range.start + range.len() / 2] ^= 0x01;
        expect_code(
            upload(&mut client, "flipped", &flipped).await,
            Code::DataLoss,
            &[&store, "fails its BLAKE3 checksum", "nothing was created"],
        );

        let cut = &whole[..range.start + range.len() / 2];
        expect_code(
            upload(&mut client, "cut", cut).await,
            Code::DataLoss,
            &[&store, "cut short", "nothing was created"],
        );
        // Cut between two files: what is missing is the manifest at the end.
        let manifest_at = file_range(&whole, "snapshot.json").start - 512;
        expect_code(
            upload(&mut client, "cut", &whole[..manifest_at]).await,
            Code::DataLoss,
            &["snapshot.json", "cut short"],
        );

        // The same through `lathe restore`, from a file.
        let file = dir.path().join(&snapshot.name);
        std::fs::write(&file, &flipped).unwrap();
        let file_arg = file.to_string_lossy().into_owned();
        let restore_file = [
            "restore",
            "--addr",
            &server.address,
            "--collection",
            "by-cli",
            &file_arg,
        ];
        let stderr = cli(&restore_file).unwrap_err();
        assert!(
            stderr.contains("DATA_LOSS") && stderr.contains(&store),
            "{stderr}"
        );

        assert_eq!(collection_names(&mut client).await, ["docs"]);
        let snapshots_dir = dir.path().join("data/snapshots");
        let leftovers: Vec<_> = std::fs::read_dir(&snapshots_dir)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name())
            .filter(|name| name != "docs")
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert!(!dir.path().join("data/collections/flipped").exists());

        // The whole file restores, once: a second restore of the name is refused.
        std::fs::write(&file, &whole).unwrap();
        cli(&restore_file).expect("the whole file restores");
        expect_code(
            upload(&mut client, "by-cli", &whole).await,
            Code::AlreadyExists,
            &["by-cli"],
        );
        let source = ask(&mut client, "docs", QUERIES[0]).await;
        let copy = ask(&mut client, "by-cli", QUERIES[0]).await;
        assert_eq!(copy.chunks, source.chunks);

        // Aliases: a snapshot through one is of its collection; a restore never takes its name.
        client
            .create_alias(proto::CreateAliasRequest {
                alias: "live".into(),
                collection: "docs".into(),
            })
            .await
            .expect("create alias");
        assert_eq!(take_snapshot(&mut client, "live").await.collection, "docs");
        expect_code(
            upload(&mut client, "live", &whole).await,
            Code::AlreadyExists,
            &["live"],
        );
        binary::stop(server);
    })
    .await
    .expect("within the test limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_outlive_their_collection_restore_from_the_servers_folder_and_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    tokio::time::timeout(TEST_LIMIT, async {
        let (server, mut client) = start(&dir.path().join("data")).await;
        create_collection(&mut client, "docs").await;
        upsert(
            &mut client,
            "docs",
            (0..30).map(sectioned_document).collect(),
        )
        .await;
        let older = take_snapshot(&mut client, "docs").await;
        upsert(
            &mut client,
            "docs",
            (30..40).map(sectioned_document).collect(),
        )
        .await;
        let newer = take_snapshot(&mut client, "docs").await;
        assert!(newer.generation > older.generation);
        let expected = ask(&mut client, "docs", QUERIES[1]).await;
        client
            .delete_collection(proto::DeleteCollectionRequest {
                name: "docs".into(),
            })
            .await
            .unwrap();

        let listed = client
            .list_snapshots(proto::ListSnapshotsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .snapshots;
        assert_eq!(listed, [newer.clone(), older.clone()], "newest first");

        let kept = format!("docs/{}", newer.name);
        cli(&["restore", "--addr", &server.address, "--snapshot", &kept])
            .expect("restore a kept snapshot");
        assert_eq!(ask(&mut client, "docs", QUERIES[1]).await, expected);

        let address = server.address.as_str();
        cli(&[
            "snapshot", "--addr", address, "create", "--all", "--keep", "1",
        ])
        .expect("snapshot every collection");
        let listed = client
            .list_snapshots(proto::ListSnapshotsRequest {
                collection: "docs".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .snapshots;
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(!listed.contains(&newer) && !listed.contains(&older));
        client
            .delete_snapshot(proto::DeleteSnapshotRequest {
                collection: "docs".into(),
                name: listed[0].name.clone(),
            })
            .await
            .unwrap();
        expect_code(
            client
                .delete_snapshot(proto::DeleteSnapshotRequest {
                    collection: "docs".into(),
                    name: listed[0].name.clone(),
                })
                .await,
            Code::NotFound,
            &[&listed[0].name],
        );
        binary::stop(server);
    })
    .await
    .expect("within the test limit");
}
