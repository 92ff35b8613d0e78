//! `lathe collections` and `lathe alias` as an operator runs them: the real binary as a process
//! against a real `lathe serve` (lexical mode). What each prints, what the server holds after
//! (read over gRPC), and a refusal exiting non-zero with the gRPC code on stderr.

mod common;

use std::process::{Command, Output};

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;

/// Runs `lathe ARGS... --addr ADDRESS` to its end.
fn lathe(address: &str, args: &[&str]) -> Output {
    Command::new(binary::lathe_binary())
        .args(args)
        .args(["--addr", address])
        .output()
        .expect("run lathe")
}

/// The lines a successful `lathe ARGS...` printed on stdout.
fn printed(address: &str, args: &[&str]) -> Vec<String> {
    let output = lathe(address, args);
    assert!(
        output.status.success(),
        "lathe {args:?} exited with {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8 output")
        .lines()
        .map(str::to_string)
        .collect()
}

/// The stderr of a `lathe ARGS...` that must fail.
fn refused(address: &str, args: &[&str]) -> String {
    let output = lathe(address, args);
    assert!(
        !output.status.success(),
        "lathe {args:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn server_aliases(client: &mut LatheClient<Channel>) -> Vec<(String, String)> {
    let listed = client
        .list_aliases(proto::ListAliasesRequest {})
        .await
        .expect("list aliases")
        .into_inner()
        .aliases;
    listed
        .into_iter()
        .map(|a| (a.alias, a.collection))
        .collect()
}

async fn server_collections(client: &mut LatheClient<Channel>) -> Vec<String> {
    let listed = client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .expect("list collections")
        .into_inner()
        .collections;
    listed.into_iter().map(|c| c.name).collect()
}

fn pair(alias: &str, collection: &str) -> (String, String) {
    (alias.to_string(), collection.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_and_aliases_are_managed_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let process = binary::start(dir.path(), &[("LATHE_MODELS__DENSE", "off".to_string())]);
    let address = process.address.clone();
    let mut client = binary::connect(&address).await;

    let created = printed(
        &address,
        &[
            "collections",
            "create",
            "docs-v1",
            "--section-tokens",
            "128",
        ],
    );
    assert_eq!(
        created,
        ["docs-v1  ready  documents 0  sections 0  aliases -"]
    );
    printed(&address, &["collections", "create", "docs-v2"]);
    let documents = ["kettle", "lighthouse"].map(|id| {
        document(
            id,
            &format!("A short note on the {id}."),
            proto::DocumentFormat::Plain,
        )
    });
    upsert(&mut client, "docs-v1", documents.to_vec()).await;
    assert_eq!(
        printed(&address, &["collections", "list"]),
        [
            "docs-v1  ready  documents 2  sections 2  aliases -",
            "docs-v2  ready  documents 0  sections 0  aliases -",
        ]
    );

    // An alias, created and switched: printed as the server answers, held as printed.
    assert_eq!(
        printed(&address, &["alias", "create", "live", "docs-v1"]),
        ["live -> docs-v1"]
    );
    assert_eq!(server_aliases(&mut client).await, [pair("live", "docs-v1")]);
    assert_eq!(
        printed(&address, &["alias", "switch", "live", "docs-v2"]),
        ["live -> docs-v2"]
    );
    assert_eq!(server_aliases(&mut client).await, [pair("live", "docs-v2")]);
    assert_eq!(printed(&address, &["alias", "list"]), ["live -> docs-v2"]);
    let through_alias = printed(&address, &["collections", "get", "live"]);
    assert_eq!(
        through_alias[0],
        "docs-v2  ready  documents 0  sections 0  aliases live"
    );
    assert!(through_alias.contains(&"  section tokens 256".to_string()));
    let first = printed(&address, &["collections", "get", "docs-v1"]);
    assert!(
        first.contains(&"  section tokens 128".to_string()),
        "{first:?}"
    );

    // Refusals exit non-zero with the code's gRPC name, and change nothing.
    let missing = refused(
        &address,
        &["alias", "create", "stale", "no-such-collection"],
    );
    assert!(missing.contains("NOT_FOUND"), "{missing}");
    assert!(missing.contains("no-such-collection"), "{missing}");
    let named = refused(&address, &["collections", "delete", "docs-v2"]);
    assert!(named.contains("FAILED_PRECONDITION"), "{named}");
    assert_eq!(server_aliases(&mut client).await, [pair("live", "docs-v2")]);

    assert_eq!(
        printed(&address, &["alias", "delete", "live"]),
        ["deleted alias live"]
    );
    assert!(server_aliases(&mut client).await.is_empty());
    assert!(printed(&address, &["alias", "list"]).is_empty());
    assert_eq!(
        printed(&address, &["collections", "delete", "docs-v2"]),
        ["deleted docs-v2"]
    );
    assert_eq!(server_collections(&mut client).await, ["docs-v1"]);
    binary::stop(process);
}

#[test]
fn health_prints_serving_and_exits_non_zero_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let process = binary::start(dir.path(), &[("LATHE_MODELS__DENSE", "off".to_string())]);
    let address = process.address.clone();
    assert_eq!(printed(&address, &["health"]), ["SERVING"]);
    assert_eq!(printed(&address, &["health", "--service", ""]), ["SERVING"]);
    // A service the server does not know is the server's NOT_FOUND, and a failure.
    let unknown = refused(&address, &["health", "--service", "lathe.v9.Nothing"]);
    assert!(unknown.contains("NOT_FOUND"), "{unknown}");
    binary::stop(process);
    // Nobody listening: a failure that says where it tried.
    let gone = refused(&address, &["health", "--timeout-seconds", "5"]);
    assert!(
        gone.contains(&format!("connecting to http://{address}")),
        "{gone}"
    );
}

/// Writes `bytes` at `root/relative`, making its folders.
fn write_file(root: &std::path::Path, relative: &str, bytes: &[u8]) {
    let path = root.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn gzipped(text: &str) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(text.as_bytes()).unwrap();
    encoder.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_reads_every_text_kind_with_its_file_metadata_and_names_what_it_skips() {
    let dir = tempfile::tempdir().unwrap();
    let process = binary::start(
        &dir.path().join("data"),
        &[("LATHE_MODELS__DENSE", "off".to_string())],
    );
    let address = process.address.clone();
    let corpus = dir.path().join("corpus");
    write_file(
        &corpus,
        "guide/intro.md",
        b"# Spindle\n\nThe spindle of a lathe turns the work.\n",
    );
    write_file(
        &corpus,
        "guide/setup.rst",
        b"Setup\n=====\n\nOil the spindle bearings weekly.\n",
    );
    write_file(
        &corpus,
        "parts.csv",
        b"part,price\nspindle,120\ntailstock,80\nchuck,45\n",
    );
    write_file(
        &corpus,
        "src/spindle.py",
        b"def spindle_speed(rpm):\n    return rpm * 2\n\n\nclass Spindle:\n    pass\n",
    );
    write_file(
        &corpus,
        "notes/history.md.gz",
        &gzipped("# History\n\nThe first spindle lathes were turned by a bow.\n"),
    );
    write_file(&corpus, "LICENSE", b"Apache spindle license text\n");
    write_file(&corpus, "photo.png", b"\x89PNG\r\n\x1a\n\0\0\0");
    write_file(&corpus, "broken.txt", b"spindle \xff\xfe not utf-8");
    write_file(&corpus, ".cache/old.md", b"# Old spindle notes\n");

    let output = binary::lathe_ingest(&address, "files", &[], corpus.clone()).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.starts_with("ingested 5 documents ("), "{stdout}");
    assert!(!stdout.contains("0.00 MB/s"), "{stdout}");
    assert!(stderr.contains("skipped 4 files:"), "{stderr}");
    let license = corpus.join("LICENSE").display().to_string();
    assert!(
        stderr.contains(&format!("1 no extension: {license}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 extension .png is not read: "),
        "{stderr}"
    );
    assert!(stderr.contains("1 binary (not UTF-8 text): "), "{stderr}");
    assert!(
        stderr.contains("1 hidden (a name starting with a dot): "),
        "{stderr}"
    );

    // Every file's document carries its path, folder and extension (the one inside a .gz).
    let mut client = binary::connect(&address).await;
    let expected = [
        ("guide/intro.md", "guide", "md", None),
        ("guide/setup.rst", "guide", "rst", None),
        ("parts.csv", ".", "csv", Some("csv")),
        ("src/spindle.py", "src", "py", Some("code")),
        ("notes/history.md.gz", "notes", "md", None),
    ];
    for (path, dir, ext, strategy) in expected {
        let mut request = retrieve_request("files", "spindle", 2048);
        request.filter = Some(proto::Filter {
            metadata: vec![proto::MetadataTerm {
                key: "path".into(),
                value: path.into(),
            }],
            doc_ids: Vec::new(),
        });
        let response = retrieve(&mut client, request).await;
        let chunk = response
            .chunks
            .first()
            .unwrap_or_else(|| panic!("{path}: no chunk"));
        assert_eq!(chunk.doc_id, path);
        assert_eq!(chunk.metadata["dir"], dir, "{path}");
        assert_eq!(chunk.metadata["ext"], ext, "{path}");
        assert_eq!(
            chunk.metadata.get("strategy").map(String::as_str),
            strategy,
            "{path}"
        );
    }

    // `lathe query --filter` narrows to them.
    let answer = printed(
        &address,
        &[
            "query", "spindle", "-c", "files", "--filter", "ext=md", "--json",
        ],
    );
    let answer: serde_json::Value = serde_json::from_str(&answer[0]).expect("JSON");
    let mut documents: Vec<&str> = answer["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|chunk| chunk["docId"].as_str().expect("docId"))
        .collect();
    documents.sort_unstable();
    documents.dedup();
    assert_eq!(documents, ["guide/intro.md", "notes/history.md.gz"]);
    binary::stop(process);
}
