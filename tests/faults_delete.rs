//! A delete is final, and the collection folder is a jail, on the real `lathe serve` binary with
//! static vectors and small dense segments, so that seals and merges run (docs/faults.md rows 34
//! and 35):
//! - a collection deleted while its dense merges and seals still run is gone for good: its folder
//!   is not recreated, its name is reusable at once (the new collection holds nothing of the
//!   old), and nothing of it is listed after a restart;
//! - a dense manifest naming a file outside its segments (a path into tantivy's folder, an
//!   absolute path) is refused as damaged: the dense index is rebuilt, and no file it named is
//!   verified or removed; a file of a name the index does not write is left where it is.
//!
//! `LATHE_TEST_BIN=/path/to/lathe cargo test --test faults_delete` runs them against another
//! build (see tests/common/binary.rs).

mod common;

use std::path::Path;
use std::time::Duration;

use common::binary::{self, Server};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;

type Client = LatheClient<Channel>;

/// Static vectors, a segment sealed every 40 vectors: a few hundred sections seal often, and
/// every fourth seal of a tier starts a merge on a thread of its own; a stop seals what is left.
fn small_segments() -> Vec<(&'static str, String)> {
    vec![
        ("LATHE_MODELS__DENSE", "static".to_string()),
        ("LATHE_DENSE__SEAL_VECTORS", "40".to_string()),
        ("LATHE_DENSE__CLOSE_SEAL_MIN_VECTORS", "1".to_string()),
    ]
}

async fn start(data_dir: &Path) -> (Server, Client) {
    let server = binary::start(data_dir, &small_segments());
    let client = binary::connect(&server.address).await;
    (server, client)
}

async fn fill(client: &mut Client, collection: &str, documents: usize) {
    for batch in (0..documents).collect::<Vec<_>>().chunks(40) {
        let batch = batch.iter().map(|&i| sectioned_document(i)).collect();
        upsert(client, collection, batch).await;
    }
}

async fn delete(client: &mut Client, name: &str) {
    client
        .delete_collection(proto::DeleteCollectionRequest { name: name.into() })
        .await
        .expect("delete collection");
}

/// The names in `folder`, sorted; none when it is absent.
fn names_in(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .map(|listing| {
            listing
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn dense_segment_files(collection: &Path) -> Vec<String> {
    names_in(&collection.join("dense"))
        .into_iter()
        .filter(|name| name.starts_with("seg-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_deleted_while_its_merges_run_stays_deleted_and_its_name_is_reusable_at_once()
{
    const ROUNDS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let collections = data.join("collections");
    let (server, mut client) = start(&data).await;
    for round in 0..ROUNDS {
        create_collection(&mut client, "c").await;
        // 250 documents, 1,250 sections: 31 seals, merges of 160 and 640 vectors, and 10
        // vectors in the live segment, sealed as the writer stops.
        fill(&mut client, "c", 250).await;
        // And writes still being applied (seals, merges) as the delete comes.
        let queued = (250..330).map(sectioned_document).collect();
        client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: "c".into(),
                documents: queued,
                wait: false,
                write_id: String::new(),
            })
            .await
            .expect("queued");
        tokio::time::sleep(Duration::from_millis(50 * round as u64)).await;
        delete(&mut client, "c").await;
        // Reused at once: whatever the old collection's merges still do must not reach it.
        create_collection(&mut client, "c").await;
        // Long enough for any merge of the old collection to end.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let info = client
            .get_collection(proto::GetCollectionRequest { name: "c".into() })
            .await
            .expect("the new collection")
            .into_inner();
        assert_eq!(
            (info.state(), info.stats.map(|s| s.documents)),
            (proto::CollectionState::Ready, Some(0)),
            "round {round}: {info:?}"
        );
        assert_eq!(
            dense_segment_files(&collections.join("c")),
            Vec::<String>::new(),
            "round {round}: the new collection holds segment files of the old"
        );
        delete(&mut client, "c").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !collections.join("c").exists(),
            "round {round}: the deleted collection's folder came back: {:?}",
            names_in(&collections.join("c"))
        );
    }
    let log: Vec<String> = server.log.try_iter().collect();
    assert!(
        !log.iter()
            .any(|line| line.contains("could not remove a dense segment file")),
        "{log:#?}"
    );
    binary::stop(server);

    let (server, mut client) = start(&data).await;
    let listed = client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .expect("list")
        .into_inner()
        .collections;
    assert!(
        listed.is_empty(),
        "a deleted collection is listed: {listed:?}"
    );
    assert_eq!(names_in(&collections), Vec::<String>::new());
    create_collection(&mut client, "c").await;
    binary::stop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_naming_files_outside_its_segments_is_refused_and_those_files_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, mut client) = start(&data).await;
    create_collection(&mut client, "c").await;
    fill(&mut client, "c", 62).await;
    binary::stop(server);

    let collection = data.join("collections").join("c");
    let dense = collection.join("dense");
    let outside = dir.path().join("unrelated.txt");
    std::fs::write(&outside, b"an operator's file").unwrap();
    let meta = collection.join("index").join("meta.json");
    let meta_before = std::fs::read(&meta).unwrap();
    // Someone else's files in the dense folder, one of them named like a segment's.
    std::fs::write(dense.join("seg-backup-manifest.json"), b"{}").unwrap();
    std::fs::write(dense.join("notes.txt"), b"kept").unwrap();

    let manifest_path = dense.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let segments = manifest["segments"].as_array_mut().unwrap();
    assert!(segments.len() >= 2, "{manifest_path:?}: too few segments");
    segments[0]["files"][1]["name"] = "../index/meta.json".into();
    segments[1]["files"][1]["name"] = outside.display().to_string().into();
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();

    let (server, mut client) = start(&data).await;
    let damaged = server
        .startup_log
        .iter()
        .find(|line| line.contains("the dense manifest is damaged"))
        .unwrap_or_else(|| {
            panic!(
                "no line names the damaged manifest: {:#?}",
                server.startup_log
            )
        });
    assert!(damaged.contains("../index/meta.json"), "{damaged}");
    assert!(
        server
            .startup_log
            .iter()
            .any(|line| line.contains("notes.txt") && line.contains("did not write")),
        "{:#?}",
        server.startup_log
    );
    assert_eq!(std::fs::read(&meta).unwrap(), meta_before);
    assert_eq!(std::fs::read(&outside).unwrap(), b"an operator's file");
    assert!(dense.join("seg-backup-manifest.json").exists());
    assert!(dense.join("notes.txt").exists());
    let info = client
        .get_collection(proto::GetCollectionRequest { name: "c".into() })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        (info.state(), info.stats.map(|s| s.documents)),
        (proto::CollectionState::Ready, Some(62)),
        "{info:?}"
    );
    let answer = retrieve(
        &mut client,
        retrieve_request("c", "granite lantern orchard", 256),
    )
    .await;
    assert!(!answer.chunks.is_empty());
    binary::stop(server);
}
