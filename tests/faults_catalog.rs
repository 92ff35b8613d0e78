//! Faults of the catalog, with the real `lathe serve` binary over real files (lexical mode): a
//! collection whose files are missing, truncated or garbled is kept and reported while the others
//! serve (docs/faults.md rows 1–9); a second server on one data dir is refused (row 10); a delete
//! the filesystem refuses changes nothing (row 11); kill -9 during a create or a delete leaves the
//! collection wholly there or wholly gone (row 12).
//!
//! `LATHE_TEST_BIN=/path/to/lathe cargo test --test faults_catalog` runs them against another
//! build (see tests/common/binary.rs).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use common::binary::{self, Server};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;
use tonic::Code;

type Client = LatheClient<Channel>;

fn lexical() -> Vec<(&'static str, String)> {
    vec![("LATHE_MODELS__DENSE", "off".to_string())]
}

async fn start(data_dir: &Path) -> (Server, Client) {
    let server = binary::start(data_dir, &lexical());
    let client = binary::connect(&server.address).await;
    (server, client)
}

fn kill_9(mut server: Server) {
    server.child.kill().expect("SIGKILL");
    // Reaped: the kernel has closed its files, and with them released its data-dir lock.
    server.child.wait().expect("wait for the killed server");
}

/// A document that only `retrieve(marker(collection, i))` finds.
fn marked_document(collection: &str, i: usize) -> proto::Document {
    let text = format!(
        "Section about {}. The operator keeps every acknowledged write of this collection safe, and the steady words fill the rest of it.",
        marker(collection, i)
    );
    document(&format!("doc{i}"), &text, proto::DocumentFormat::Plain)
}

fn marker(collection: &str, i: usize) -> String {
    format!("zq{}x{i}", collection.replace(['-', '_'], ""))
}

async fn fill(client: &mut Client, collection: &str, documents: usize) {
    for batch in (0..documents).collect::<Vec<_>>().chunks(100) {
        let batch = batch
            .iter()
            .map(|&i| marked_document(collection, i))
            .collect();
        upsert(client, collection, batch).await;
    }
}

/// The documents whose marker finds them, checked one by one.
async fn assert_serves(client: &mut Client, collection: &str, documents: usize) {
    let info = get(client, collection).await.expect("get collection");
    assert_eq!(
        (info.state(), info.stats.map(|s| s.documents)),
        (proto::CollectionState::Ready, Some(documents as u64)),
        "{collection}: {info:?}"
    );
    for i in 0..documents {
        let found = retrieve(
            client,
            retrieve_request(collection, &marker(collection, i), 256),
        )
        .await;
        assert!(
            found
                .chunks
                .iter()
                .any(|chunk| chunk.doc_id == format!("doc{i}")),
            "{collection}: doc{i} is not found by its marker: {found:?}"
        );
    }
}

async fn get(client: &mut Client, name: &str) -> Result<proto::CollectionInfo, tonic::Status> {
    client
        .get_collection(proto::GetCollectionRequest {
            name: name.to_string(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn listed(client: &mut Client) -> BTreeMap<String, proto::CollectionInfo> {
    client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .expect("list collections")
        .into_inner()
        .collections
        .into_iter()
        .map(|info| (info.name.clone(), info))
        .collect()
}

async fn create_with_tokenizer(client: &mut Client, name: &str, tokenizer: &Path) {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: name.to_string(),
            settings: Some(proto::CollectionSettings {
                budget_tokenizer: tokenizer.display().to_string(),
                ..Default::default()
            }),
        })
        .await
        .expect("create collection with a tokenizer file");
}

/// Every file under `folder` with its length: what "kept as found" is checked against.
fn files_with_lengths(folder: &Path) -> BTreeMap<PathBuf, u64> {
    let mut files = BTreeMap::new();
    let mut pending = vec![folder.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for item in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let item = item.unwrap();
            let path = item.path();
            if item.file_type().unwrap().is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(folder).unwrap().to_path_buf();
                files.insert(relative, item.metadata().unwrap().len());
            }
        }
    }
    files
}

/// Status, and the message it must carry, of Retrieve, Upsert and DeleteDocuments on `name`.
async fn assert_calls_refused(client: &mut Client, name: &str, code: Code, names: &[&str]) {
    let check = |call: &str, result: Result<(), tonic::Status>| {
        let status = result.expect_err(&format!("{call} on {name} must be refused"));
        assert_eq!(status.code(), code, "{call} on {name}: {status:?}");
        for needle in names.iter().chain([&format!("`{name}`").as_str()]) {
            assert!(
                status.message().contains(needle),
                "{call} on {name}: the message does not name `{needle}`: {}",
                status.message()
            );
        }
    };
    check(
        "Retrieve",
        client
            .retrieve(retrieve_request(name, "operator", 256))
            .await
            .map(drop),
    );
    check(
        "UpsertDocuments",
        client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: name.to_string(),
                documents: vec![marked_document(name, 99)],
                wait: true,
                write_id: String::new(),
            })
            .await
            .map(drop),
    );
    check(
        "DeleteDocuments",
        client
            .delete_documents(proto::DeleteDocumentsRequest {
                collection: name.to_string(),
                ids: vec!["doc0".into()],
                wait: true,
                write_id: String::new(),
            })
            .await
            .map(drop),
    );
}

/// The value of one series in the Prometheus text, e.g. `lathe_collections{state="ready"}`.
fn metric(body: &str, series: &str) -> Option<i64> {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// The catalog's ERROR line of the startup log about `collection`, which must name `file`: the
/// only ERROR line about it (a damaged index file is not logged again by the checksum check that
/// found it).
fn assert_logged(startup_log: &[String], collection: &str, file: &str) {
    let error_lines: Vec<&String> = startup_log
        .iter()
        .filter(|line| {
            line.contains(&format!("\"collection\":\"{collection}\"")) && line.contains("\"ERROR\"")
        })
        .collect();
    assert_eq!(
        error_lines.len(),
        1,
        "one ERROR line about {collection}, not {}:\n{}",
        error_lines.len(),
        startup_log.join("\n")
    );
    let line = error_lines
        .into_iter()
        .find(|line| line.contains("collection cannot be opened"))
        .unwrap_or_else(|| {
            panic!(
                "no ERROR line names {collection}; startup log:\n{}",
                startup_log.join("\n")
            )
        });
    assert!(
        line.contains(file),
        "the line about {collection} does not name {file}: {line}"
    );
}

fn largest_file_with_extension(index_dir: &Path, extension: &str) -> PathBuf {
    std::fs::read_dir(index_dir)
        .unwrap()
        .map(|item| item.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .max_by_key(|path| path.metadata().unwrap().len())
        .unwrap_or_else(|| panic!("no .{extension} file in {}", index_dir.display()))
}

fn truncate_to_half(path: &Path) {
    let length = path.metadata().unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(length / 2)
        .unwrap();
}

/// Item 1: a collection whose `collection.json` went missing was removed whole at the next start.
/// It must be kept, reported, and back with every document once the file is restored; only the
/// staging folders the catalog makes itself may be removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_without_its_settings_file_is_kept_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let collections = data.join("collections");
    let (server, mut client) = start(&data).await;
    create_collection(&mut client, "kept").await;
    create_collection(&mut client, "healthy").await;
    fill(&mut client, "kept", 24).await;
    fill(&mut client, "healthy", 3).await;
    binary::stop(server);

    let kept = collections.join("kept");
    let files_before = files_with_lengths(&kept);
    let settings_aside = dir.path().join("collection.json");
    std::fs::rename(kept.join("collection.json"), &settings_aside).unwrap();
    // What a crash leaves of an unfinished create and of an unfinished delete (removable), and
    // folders the catalog never makes (to be kept).
    let unfinished_create = collections.join(".creating-ghost");
    std::fs::create_dir_all(unfinished_create.join("index")).unwrap();
    std::fs::write(unfinished_create.join("collection.json"), b"{}").unwrap();
    let unfinished_delete = collections.join(".deleting-gone");
    std::fs::create_dir_all(unfinished_delete.join("index")).unwrap();
    std::fs::write(unfinished_delete.join("index/meta.json"), b"{}").unwrap();
    let foreign = [
        collections.join(".creating-odd"),
        collections.join("backup.old"),
        collections.join(".snapshot"),
    ];
    for folder in &foreign {
        std::fs::create_dir_all(folder).unwrap();
        std::fs::write(folder.join("notes.txt"), b"an operator's file").unwrap();
    }

    let (server, mut client) = start(&data).await;
    let listing = listed(&mut client).await;
    let info = listing
        .get("kept")
        .unwrap_or_else(|| panic!("`kept` is no longer listed: {listing:?}"));
    assert_eq!(info.state(), proto::CollectionState::Damaged, "{info:?}");
    assert!(
        info.reason
            .contains(&kept.join("collection.json").display().to_string()),
        "the reason does not name the missing file: {info:?}"
    );
    assert_eq!(
        files_with_lengths(&kept),
        files_before
            .into_iter()
            .filter(|(path, _)| path != Path::new("collection.json"))
            .collect(),
        "the damaged collection's files changed"
    );
    assert_logged(&server.startup_log, "kept", "collection.json");
    assert_calls_refused(&mut client, "kept", Code::DataLoss, &["collection.json"]).await;
    assert_serves(&mut client, "healthy", 3).await;
    let metrics = binary::scrape_metrics(&server.metrics_address);
    assert_eq!(
        metric(&metrics, "lathe_collection_damaged{collection=\"kept\"}"),
        Some(1),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "lathe_collection_damaged{collection=\"healthy\"}"),
        Some(0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "lathe_collections{state=\"damaged\"}"),
        Some(1),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "lathe_collections{state=\"ready\"}"),
        Some(1),
        "{metrics}"
    );
    assert!(
        !unfinished_create.exists(),
        "an unfinished create's staging folder is left"
    );
    assert!(
        !unfinished_delete.exists(),
        "an unfinished delete's folder is left"
    );
    for folder in &foreign {
        assert!(
            folder.join("notes.txt").exists(),
            "{} was removed",
            folder.display()
        );
    }
    binary::stop(server);

    // The operator restores the file: every acknowledged document is back.
    std::fs::rename(&settings_aside, kept.join("collection.json")).unwrap();
    let (server, mut client) = start(&data).await;
    assert_serves(&mut client, "kept", 24).await;
    assert_serves(&mut client, "healthy", 3).await;
    binary::stop(server);
}

/// Item 3: one damaged collection stopped the whole server (exit 1). Each kind of damage must be
/// reported (list, get, log, metrics, and DATA_LOSS or FAILED_PRECONDITION naming the collection
/// and the file on calls to it), the healthy collection must serve, and each damaged collection
/// must be deletable and its name reusable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_collections_are_reported_and_the_others_serve() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let collections = data.join("collections");
    let tokenizer_copy = dir.path().join("tokenizers/tokenizer.json");
    std::fs::create_dir_all(tokenizer_copy.parent().unwrap()).unwrap();
    std::fs::copy(models_dir().join("minilm/tokenizer.json"), &tokenizer_copy).unwrap();

    // (collection, state, status on calls)
    let damaged: [(&str, proto::CollectionState, Code); 8] = [
        ("cut-idx", proto::CollectionState::Damaged, Code::DataLoss),
        ("cut-store", proto::CollectionState::Damaged, Code::DataLoss),
        ("cut-term", proto::CollectionState::Damaged, Code::DataLoss),
        (
            "meta-garbage",
            proto::CollectionState::Damaged,
            Code::DataLoss,
        ),
        (
            "meta-empty",
            proto::CollectionState::Damaged,
            Code::DataLoss,
        ),
        // tantivy's `open_or_create` would make an empty index in its place.
        (
            "meta-missing",
            proto::CollectionState::Damaged,
            Code::DataLoss,
        ),
        (
            "settings-garbled",
            proto::CollectionState::Damaged,
            Code::DataLoss,
        ),
        (
            "tokenizer-gone",
            proto::CollectionState::Offline,
            Code::FailedPrecondition,
        ),
    ];
    let (server, mut client) = start(&data).await;
    create_collection(&mut client, "healthy").await;
    fill(&mut client, "healthy", 5).await;
    for (name, ..) in &damaged {
        if *name == "tokenizer-gone" {
            create_with_tokenizer(&mut client, name, &tokenizer_copy).await;
        } else {
            create_collection(&mut client, name).await;
        }
        fill(&mut client, name, 5).await;
    }
    binary::stop(server);

    let index_of = |name: &str| collections.join(name).join("index");
    // The exact file each reason must name, where one file was damaged.
    let mut damaged_file: BTreeMap<&str, String> = BTreeMap::new();
    for (name, extension) in [
        ("cut-idx", "idx"),
        ("cut-store", "store"),
        ("cut-term", "term"),
    ] {
        let file = largest_file_with_extension(&index_of(name), extension);
        truncate_to_half(&file);
        damaged_file.insert(name, file.display().to_string());
    }
    for name in ["meta-garbage", "meta-empty", "meta-missing"] {
        damaged_file.insert(name, index_of(name).join("meta.json").display().to_string());
    }
    damaged_file.insert(
        "settings-garbled",
        collections
            .join("settings-garbled/collection.json")
            .display()
            .to_string(),
    );
    damaged_file.insert("tokenizer-gone", tokenizer_copy.display().to_string());
    std::fs::write(
        index_of("meta-garbage").join("meta.json"),
        b"\x00\x17garbage\xff{",
    )
    .unwrap();
    std::fs::write(index_of("meta-empty").join("meta.json"), b"").unwrap();
    std::fs::remove_file(index_of("meta-missing").join("meta.json")).unwrap();
    std::fs::write(
        collections.join("settings-garbled/collection.json"),
        b"{\"budget_tokenizer\": 12",
    )
    .unwrap();
    std::fs::remove_file(&tokenizer_copy).unwrap();
    let files_before: BTreeMap<&str, BTreeMap<PathBuf, u64>> = damaged
        .iter()
        .map(|(name, ..)| (*name, files_with_lengths(&collections.join(name))))
        .collect();

    let (server, mut client) = start(&data).await;
    assert_serves(&mut client, "healthy", 5).await;
    let listing = listed(&mut client).await;
    for (name, state, code) in &damaged {
        let file = &damaged_file[name];
        let info = listing
            .get(*name)
            .unwrap_or_else(|| panic!("{name} is not listed: {listing:?}"));
        assert_eq!(info.state(), *state, "{name}: {info:?}");
        assert!(
            info.reason.contains(file),
            "{name}: the reason does not name {file}: {info:?}"
        );
        assert_eq!(
            &get(&mut client, name)
                .await
                .expect("get a damaged collection"),
            info
        );
        assert_logged(&server.startup_log, name, file);
        assert_calls_refused(&mut client, name, *code, &[file.as_str()]).await;
        assert_eq!(
            files_with_lengths(&collections.join(name)),
            files_before[name],
            "{name}: its files changed"
        );
    }
    let metrics = binary::scrape_metrics(&server.metrics_address);
    assert_eq!(
        metric(&metrics, "lathe_collections{state=\"ready\"}"),
        Some(1),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "lathe_collections{state=\"damaged\"}"),
        Some(7),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "lathe_collections{state=\"offline\"}"),
        Some(1),
        "{metrics}"
    );
    for (name, ..) in &damaged {
        let series = format!("lathe_collection_damaged{{collection=\"{name}\"}}");
        assert_eq!(metric(&metrics, &series), Some(1), "{series} in\n{metrics}");
    }

    // The operator deletes each damaged collection and makes it anew under the same name.
    for (name, ..) in &damaged {
        client
            .delete_collection(proto::DeleteCollectionRequest {
                name: name.to_string(),
            })
            .await
            .unwrap_or_else(|status| panic!("delete {name}: {status:?}"));
        assert!(
            !collections.join(name).exists(),
            "{name}: its folder is left"
        );
        create_collection(&mut client, name).await;
        fill(&mut client, name, 2).await;
        assert_serves(&mut client, name, 2).await;
    }
    let metrics = binary::scrape_metrics(&server.metrics_address);
    assert_eq!(
        metric(&metrics, "lathe_collections{state=\"ready\"}"),
        Some(9),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "lathe_collections{state=\"damaged\"}"),
        Some(0),
        "{metrics}"
    );
    for (name, ..) in &damaged {
        let series = format!("lathe_collection_damaged{{collection=\"{name}\"}}");
        assert_eq!(metric(&metrics, &series), Some(0), "{series} in\n{metrics}");
    }
    binary::stop(server);
    let (server, mut client) = start(&data).await;
    assert_serves(&mut client, "healthy", 5).await;
    for (name, ..) in &damaged {
        assert_serves(&mut client, name, 2).await;
    }
    binary::stop(server);
}

/// Waits for a spawned server to exit; a server that serves instead is a failure.
fn expect_exit(spawned: &mut binary::Spawned) -> (ExitStatus, Vec<String>) {
    let mut log = Vec::new();
    // The log ends when the process closes its stderr, i.e. when it exits.
    while let Ok(line) = spawned.log.recv_timeout(Duration::from_secs(120)) {
        if line.contains("lathe serving") {
            let _ = spawned.child.kill();
            let _ = spawned.child.wait();
            panic!(
                "a second server serves the same data dir; its log:\n{}\n{line}",
                log.join("\n")
            );
        }
        log.push(line);
    }
    let status = spawned.child.wait().expect("wait for the second server");
    (status, log)
}

/// Item 4: a second `lathe serve` on the same data dir served beside the first (empty dir) or died
/// with tantivy's "LockBusy" naming neither the folder nor the cause. It must exit non-zero before
/// opening any collection, naming the data dir and the first server's pid; the first serves on,
/// and after the first is killed with SIGKILL the lock is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (first, mut client) = start(&data).await;
    let first_pid = first.child.id();
    let check_refused = |when: &str| {
        let mut second = binary::spawn(&data, &lexical());
        let (status, log) = expect_exit(&mut second);
        let log = log.join("\n");
        assert!(
            !status.success(),
            "{when}: the second server exited with {status}"
        );
        assert!(
            log.contains(&data.display().to_string()) && log.contains(&format!("pid {first_pid}")),
            "{when}: the refusal names neither the data dir nor pid {first_pid}:\n{log}"
        );
        assert!(
            !log.contains("opened collection"),
            "{when}: the second server opened a collection before refusing:\n{log}"
        );
    };
    check_refused("on an empty data dir");
    create_collection(&mut client, "c").await;
    fill(&mut client, "c", 4).await;
    check_refused("with a collection");
    assert_serves(&mut client, "c", 4).await;
    // Writes still work: the second server took nothing from the first.
    upsert(&mut client, "c", vec![marked_document("c", 4)]).await;
    kill_9(first);

    let (server, mut client) = start(&data).await;
    assert_serves(&mut client, "c", 5).await;
    binary::stop(server);
}

/// Makes a folder refuse renames, as root does not respect permissions: `chattr +i` as root,
/// else read-only permissions. Undone on drop, also when the test fails.
struct RenameRefused(PathBuf);

impl RenameRefused {
    fn new(folder: &Path) -> Self {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        let status = if root {
            Command::new("chattr").arg("+i").arg(folder).status()
        } else {
            Command::new("chmod").arg("0555").arg(folder).status()
        };
        assert!(
            status.is_ok_and(|s| s.success()),
            "cannot make {} refuse renames (chattr +i as root needs ext4, xfs or btrfs)",
            folder.display()
        );
        Self(folder.to_path_buf())
    }
}

impl Drop for RenameRefused {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        let _ = Command::new("chmod").arg("0755").arg(&self.0).status();
    }
}

/// Item 6: when renaming the folder failed, DeleteCollection answered INTERNAL but had already
/// unlisted the collection (NOT_FOUND until a restart brought it back). A refused delete must
/// change nothing: the collection stays listed, readable and writable, and the error names the
/// collection, the path and the OS cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_the_filesystem_refuses_changes_nothing() {
    // Under target/ (ext4 here), not /tmp, which may be a tmpfs without `chattr +i`.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let collections = data.join("collections");
    let (server, mut client) = start(&data).await;
    create_collection(&mut client, "c").await;
    fill(&mut client, "c", 3).await;

    let mut documents = 3;
    for refusing in [collections.clone(), collections.join("c")] {
        let guard = RenameRefused::new(&refusing);
        let status = client
            .delete_collection(proto::DeleteCollectionRequest { name: "c".into() })
            .await
            .expect_err("the delete must fail");
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        let message = status.message();
        assert!(
            message.contains("`c`")
                && message.contains(&collections.join("c").display().to_string())
                && (message.contains("Operation not permitted")
                    || message.contains("Permission denied"))
                && message.contains("nothing was changed"),
            "the message must name the collection, the path and the cause: {message}"
        );
        assert!(listed(&mut client).await.contains_key("c"));
        assert_serves(&mut client, "c", documents).await;
        upsert(&mut client, "c", vec![marked_document("c", documents)]).await;
        documents += 1;
        assert_serves(&mut client, "c", documents).await;
        let again = client
            .create_collection(proto::CreateCollectionRequest {
                name: "c".into(),
                settings: None,
            })
            .await
            .expect_err("c still exists");
        assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
        drop(guard);
    }

    let metrics = binary::scrape_metrics(&server.metrics_address);
    assert_eq!(
        metric(&metrics, "lathe_collection_documents{collection=\"c\"}"),
        Some(documents as i64),
        "{metrics}"
    );
    client
        .delete_collection(proto::DeleteCollectionRequest { name: "c".into() })
        .await
        .expect("the delete succeeds once the folder may be renamed");
    assert!(!collections.join("c").exists());
    // No series of the deleted collection is left at its last value.
    let metrics = binary::scrape_metrics(&server.metrics_address);
    assert!(
        !metrics.contains("collection=\"c\""),
        "series of the deleted collection remain:\n{metrics}"
    );
    create_collection(&mut client, "c").await;
    fill(&mut client, "c", 1).await;
    binary::stop(server);
    // After a restart: the new collection, not the old one.
    let (server, mut client) = start(&data).await;
    assert_serves(&mut client, "c", 1).await;
    binary::stop(server);
}

/// Kept from main (the issue: 19 of 19 trials): kill -9 while a collection of a few hundred
/// documents is being deleted, or while one is being created, leaves it wholly there (listed,
/// every document) or wholly gone (not listed, no folder), never a leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_create_or_delete_leaves_the_collection_whole_or_gone() {
    const DOCUMENTS: usize = 300;
    /// Trial t kills at a random moment in window t (µs after the requests leave): from before
    /// the server sees them to after both are done. In a debug build on 2 busy cores a delete of
    /// this collection takes 30–70 ms and a create (which syncs its files) 140–270 ms.
    const KILL_WINDOWS_MICROS: [(u64, u64); 7] = [
        (0, 15_000),
        (15_000, 30_000),
        (30_000, 60_000),
        (60_000, 120_000),
        (120_000, 200_000),
        (200_000, 300_000),
        (300_000, 450_000),
    ];
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let collections = data.join("collections");
    let mut seed = 0x0dd_5eed_u64;
    let mut next_random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut outcomes = Vec::new();
    for (trial, (window_start, window_end)) in KILL_WINDOWS_MICROS.into_iter().enumerate() {
        let (server, mut client) = start(&data).await;
        if !listed(&mut client).await.contains_key("big") {
            create_collection(&mut client, "big").await;
            fill(&mut client, "big", DOCUMENTS).await;
        }
        // Delete "big" and create "fresh{trial}" at once; SIGKILL at a random moment.
        let fresh = format!("fresh{trial}");
        let mut deleting = client.clone();
        let mut creating = client.clone();
        let create_name = fresh.clone();
        let delete = tokio::spawn(async move {
            deleting
                .delete_collection(proto::DeleteCollectionRequest { name: "big".into() })
                .await
        });
        let create = tokio::spawn(async move {
            creating
                .create_collection(proto::CreateCollectionRequest {
                    name: create_name,
                    settings: None,
                })
                .await
        });
        let kill_after = window_start + next_random() % (window_end - window_start);
        tokio::time::sleep(Duration::from_micros(kill_after)).await;
        kill_9(server);
        let hidden_at_kill = hidden_entries(&collections);
        let delete_acknowledged = matches!(delete.await, Ok(Ok(_)));
        let create_acknowledged = matches!(create.await, Ok(Ok(_)));

        let (server, mut client) = start(&data).await;
        let listing = listed(&mut client).await;
        let big_there = listing.contains_key("big");
        if big_there {
            assert!(
                !delete_acknowledged,
                "trial {trial}: an acknowledged delete came back"
            );
            assert_serves(&mut client, "big", DOCUMENTS).await;
        } else {
            assert!(
                !collections.join("big").exists(),
                "trial {trial}: big's folder is left"
            );
        }
        let fresh_there = listing.contains_key(&fresh);
        if fresh_there {
            assert_serves(&mut client, &fresh, 0).await;
        } else {
            assert!(
                !create_acknowledged,
                "trial {trial}: an acknowledged create is gone"
            );
            assert!(
                !collections.join(&fresh).exists(),
                "trial {trial}: {fresh}'s folder is left"
            );
        }
        let leftovers = hidden_entries(&collections);
        assert!(
            leftovers.is_empty(),
            "trial {trial}: leftovers {leftovers:?}"
        );
        outcomes.push((kill_after / 1000, hidden_at_kill, big_there, fresh_there));
        binary::stop(server);
    }
    eprintln!("(kill after ms, staging folders at the kill, big still there, fresh there) per trial: {outcomes:?}");
}

fn hidden_entries(collections: &Path) -> Vec<String> {
    std::fs::read_dir(collections)
        .unwrap()
        .map(|item| item.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with('.'))
        .collect()
}
