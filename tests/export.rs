//! `lathe export` on the real binary: a snapshot of a collection (Markdown with nested headings,
//! plain and non-ASCII text, HTML, metadata, a deleted and an updated document) exported as JSONL
//! holds exactly the live documents, each text byte for byte as it was upserted (HTML as its
//! extracted text); that JSONL ingested with `lathe ingest` into a fresh collection on another
//! server answers Retrieve with the source's chunks (texts and offsets). A snapshot cut short is
//! refused naming the problem, and nothing is written.
//!
//! `LATHE_TEST_BIN=/path/to/lathe cargo test --test export` runs it against another build.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::binary::{self, Server};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use proto::DocumentFormat::{Html, Markdown, Plain};
use tonic::transport::Channel;

type Client = LatheClient<Channel>;

const GUIDE: &str = "# Install\n\nRun the lantern installer first.\n\n## On Debian\n\nUse apt to \
fetch the granite package.\n\n# Usage\n\nStart the falcon daemon with a walnut config.\n";
const NOTES: &str = "Orchard voltage readings, taken daily.\n\nThe copper river runs past the \
quarry and the harbor meadow.";
const CAFE: &str = "Café naïve über: a résumé of the meadow cipher.\n\nZephyr beacons — ünïcode.";
const PAGE: &str = "<html><body><h1>Tundra</h1><p>The glacier moves <b>slowly</b>.</p>\
<h2>Fauna</h2><p>Caribou cross the tundra glacier.</p></body></html>";
const CHANGED_OLD: &str = "Old zephyr beacon text that is replaced.";
const CHANGED_NEW: &str = "New saddle thimble text.\n\nA second paragraph about the zephyr.";

const QUERIES: [&str; 7] = [
    "granite package apt",
    "lantern installer",
    "copper river quarry",
    "meadow cipher résumé",
    "saddle thimble zephyr",
    "falcon daemon walnut",
    "caribou glacier tundra",
];

fn variables() -> Vec<(&'static str, String)> {
    vec![("LATHE_MODELS__DENSE", "static".to_string())]
}

async fn start(data_dir: &Path) -> (Server, Client) {
    let server = binary::start(data_dir, &variables());
    let client = binary::connect(&server.address).await;
    (server, client)
}

fn with_metadata(mut document: proto::Document, pairs: &[(&str, &str)]) -> proto::Document {
    for (key, value) in pairs {
        document.metadata.insert(key.to_string(), value.to_string());
    }
    document
}

/// `lathe ARGS` run to its end: (success, stdout, stderr).
fn lathe(args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(binary::lathe_binary())
        .args(args)
        .output()
        .expect("run lathe");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (
        output.status.success(),
        text(&output.stdout),
        text(&output.stderr),
    )
}

/// A snapshot of `collection`, downloaded.
async fn snapshot_bytes(client: &mut Client, collection: &str) -> Vec<u8> {
    let snapshot = client
        .create_snapshot(proto::CreateSnapshotRequest {
            collection: collection.into(),
        })
        .await
        .expect("create snapshot")
        .into_inner();
    let mut stream = client
        .download_snapshot(proto::DownloadSnapshotRequest {
            collection: snapshot.collection,
            name: snapshot.name,
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

/// What of a chunk must survive an export and an ingest: where it lies and what it says.
#[derive(Debug, PartialEq)]
struct Placed {
    doc_id: String,
    text: String,
    bytes: Option<(u64, u64)>,
    chars: Option<(u64, u64)>,
    heading_path: String,
    context: String,
    metadata: BTreeMap<String, String>,
}

async fn placed_chunks(client: &mut Client, collection: &str, query: &str) -> Vec<Placed> {
    let response = retrieve(client, retrieve_request(collection, query, 200)).await;
    response
        .chunks
        .into_iter()
        .map(|chunk| Placed {
            doc_id: chunk.doc_id,
            text: chunk.text,
            bytes: chunk.bytes.map(|span| (span.start, span.end)),
            chars: chunk.chars.map(|span| (span.start, span.end)),
            heading_path: chunk.heading_path.join(" > "),
            context: chunk.context,
            metadata: chunk.metadata.into_iter().collect(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_snapshot_ingested_elsewhere_answers_as_the_source() {
    let source_dir = tempfile::tempdir().unwrap();
    let (source, mut client) = start(source_dir.path()).await;
    create_collection(&mut client, "docs").await;
    let guide = with_metadata(document("guide", GUIDE, Markdown), &[("team", "docs")]);
    let notes = with_metadata(document("notes", NOTES, Plain), &[("lang", "en")]);
    let gone = document("gone", "Deleted granite lantern text.", Plain);
    let changed = document("changed", CHANGED_OLD, Plain);
    let cafe = document("cafe", CAFE, Plain);
    let page = document("page", PAGE, Html);
    upsert(
        &mut client,
        "docs",
        vec![guide, notes, gone, changed, cafe, page],
    )
    .await;
    upsert(
        &mut client,
        "docs",
        vec![with_metadata(
            document("changed", CHANGED_NEW, Plain),
            &[("v", "2")],
        )],
    )
    .await;
    client
        .delete_documents(proto::DeleteDocumentsRequest {
            collection: "docs".into(),
            ids: vec!["gone".into()],
            wait: true,
            write_id: String::new(),
        })
        .await
        .expect("delete");
    let mut expected = Vec::new();
    for query in QUERIES {
        expected.push(placed_chunks(&mut client, "docs", query).await);
    }
    let bytes = snapshot_bytes(&mut client, "docs").await;
    binary::stop(source);

    let work = tempfile::tempdir().unwrap();
    let snapshot_file = work.path().join("docs.snapshot");
    std::fs::write(&snapshot_file, &bytes).unwrap();
    let jsonl = work.path().join("docs.jsonl");
    let (ok, stdout, stderr) = lathe(&[
        "export",
        snapshot_file.to_str().unwrap(),
        "--out",
        jsonl.to_str().unwrap(),
    ]);
    assert!(ok, "export failed: {stderr}");
    assert!(stdout.is_empty(), "the JSONL went to --out: {stdout}");
    assert!(
        stderr.contains("exported 5 documents")
            && stderr.contains("collection `docs`")
            && stderr.contains("1 documents end in whitespace")
            && !stderr.contains("was filled"),
        "{stderr}"
    );
    // The same lines on stdout without --out.
    let (ok, stdout, _) = lathe(&["export", snapshot_file.to_str().unwrap()]);
    assert!(ok);
    let written = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(stdout, written);

    let lines: Vec<serde_json::Value> = written
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let texts: BTreeMap<&str, &str> = lines
        .iter()
        .filter(|line| line["id"] != "page")
        .map(|line| (line["id"].as_str().unwrap(), line["text"].as_str().unwrap()))
        .collect();
    assert_eq!(
        texts,
        BTreeMap::from([
            ("cafe", CAFE),
            ("changed", CHANGED_NEW),
            ("guide", GUIDE),
            ("notes", NOTES)
        ]),
        "exactly the live documents, each text byte for byte as upserted"
    );
    let line = |id: &str| lines.iter().find(|line| line["id"] == id).unwrap();
    // HTML comes out as the text Lathe extracted from it, which its offsets refer to.
    let page = line("page")["text"].as_str().unwrap();
    assert!(
        page.contains("The glacier moves slowly.") && !page.contains('<'),
        "{page}"
    );
    assert_eq!(line("page")["format"], "plain");
    assert_eq!(
        line("guide")["metadata"],
        serde_json::json!({"team": "docs"})
    );
    assert_eq!(line("changed")["metadata"], serde_json::json!({"v": "2"}));
    assert_eq!(line("guide")["title"], "guide");
    let guide_titles: Vec<&str> = line("guide")["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|section| section["title"].as_str().unwrap())
        .collect();
    assert_eq!(guide_titles, ["Install", "Install > On Debian", "Usage"]);

    let target_dir = tempfile::tempdir().unwrap();
    let (target, mut client) = start(target_dir.path()).await;
    create_collection(&mut client, "restored").await;
    let output = binary::lathe_ingest(&target.address, "restored", &[], jsonl).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    drain_queue(&mut client, "restored").await;
    for (query, expected) in QUERIES.iter().zip(&expected) {
        assert!(!expected.is_empty(), "`{query}` finds something");
        let got = placed_chunks(&mut client, "restored", query).await;
        assert_eq!(&got, expected, "`{query}` answers as the source did");
    }
    binary::stop(target);
}

#[test]
fn a_snapshot_cut_short_is_refused_naming_the_problem_and_nothing_is_written() {
    let data_dir = tempfile::tempdir().unwrap();
    let bytes = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (server, mut client) = start(data_dir.path()).await;
        create_collection(&mut client, "docs").await;
        upsert(&mut client, "docs", vec![document("notes", NOTES, Plain)]).await;
        let bytes = snapshot_bytes(&mut client, "docs").await;
        binary::stop(server);
        bytes
    });
    let work = tempfile::tempdir().unwrap();
    let cut = work.path().join("cut.snapshot");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = work.path().join("out.jsonl");
    for args in [
        vec![
            "export",
            cut.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        vec!["export", cut.to_str().unwrap()],
    ] {
        let (ok, stdout, stderr) = lathe(&args);
        assert!(!ok, "a cut snapshot was exported");
        assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
        assert!(
            stderr.contains(&format!("snapshot `{}` cannot be exported", cut.display()))
                && stderr.contains("cut short")
                && stderr.contains("nothing was written"),
            "{stderr}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("cut.snapshot")]);
}
