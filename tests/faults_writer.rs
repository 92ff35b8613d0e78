//! Faults on the write side, against the real `lathe serve` binary and real files (issue 11,
//! items 8 and 5; rows of docs/faults.md):
//! - idle collections hold no writer threads and no open files: the server's threads and
//!   descriptors with 200 idle collections stay within a constant of an empty server's, and
//!   after a burst of writes to many collections they fall back once the writers close;
//! - a full disk answers RESOURCE_EXHAUSTED, a read-only filesystem and an immutable index folder
//!   FAILED_PRECONDITION, each naming the collection, the path and the operating system's cause,
//!   on every write (never "index writer was killed"); reads go on meanwhile and writes resume by
//!   themselves once the fault is gone. The write queue lives outside the faulty folder: the
//!   first write after the fault is queued and waits (its operation says why it is retrying),
//!   the later ones are refused with the disk's error, and the queued one is applied, once, when
//!   the fault is gone.
//!
//! The storage tests put `data_dir/collections` on a small tmpfs (mounting needs root, which CI
//! and the development machines have); a guard unmounts it even when the test panics.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::binary::{self, Server};
use common::tmpfs::{run, Tmpfs};
use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;
use tonic::Code;

type Client = LatheClient<Channel>;

/// Lexical mode: the writer's costs without a model's.
fn lexical(extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut variables = vec![("LATHE_MODELS__DENSE", "off".to_string())];
    variables.extend(extra.iter().map(|(name, value)| (*name, value.to_string())));
    variables
}

/// Threads and open descriptors of a process, from /proc.
#[derive(Clone, Copy, Debug)]
struct Usage {
    threads: u64,
    fds: u64,
}

fn usage(server: &Server) -> Usage {
    let pid = server.child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let threads = status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|rest| rest.trim().parse().ok())
        .expect("Threads: in /proc status");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc fd")
        .count() as u64;
    Usage { threads, fds }
}

/// Threads of process `pid` that belong to an index writer, by the names tantivy gives them
/// (`comm` holds the first 15 bytes).
fn writer_threads(pid: u32) -> u64 {
    const WRITER_THREADS: [&str; 4] = [
        "thrd-tantivy-in",
        "docstore-compre",
        "segment_updater",
        "merge_thread_",
    ];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| WRITER_THREADS.iter().any(|prefix| name.starts_with(prefix)))
        .count() as u64
}

/// Series of the Prometheus endpoint named `name` (any labels).
fn series(server: &Server, name: &str) -> usize {
    let prefix = format!("{name}{{");
    scrape(server)
        .lines()
        .filter(|line| line.starts_with(&prefix))
        .count()
}

/// One value of the Prometheus endpoint.
fn metric(server: &Server, name: &str) -> i64 {
    let body = scrape(server);
    let prefix = format!("{name} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

/// The Prometheus endpoint's text (a plain HTTP/1.0 GET).
fn scrape(server: &Server) -> String {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(&server.metrics_address).expect("metrics connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: lathe\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("metrics response");
    body
}

/// Polls `condition` every 50 ms until it holds; panics with `what` after `limit`.
fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(mut server: Server) {
    binary::sigterm(&server.child);
    let status = binary::wait_for_exit(&mut server.child, Duration::from_secs(120));
    assert!(status.success(), "lathe exited with {status}");
}

fn collection_name(i: usize) -> String {
    format!("tenant-{i:04}")
}

fn note(id: &str, word: &str) -> proto::Document {
    document(
        id,
        &format!("A short note about {word} and the ledger of {id}."),
        proto::DocumentFormat::Plain,
    )
}

async fn upsert_one(
    client: &mut Client,
    collection: &str,
    doc: proto::Document,
) -> Result<(), tonic::Status> {
    client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: collection.to_string(),
            documents: vec![doc],
            wait: true,
            write_id: String::new(),
        })
        .await
        .map(|_| ())
}

/// The ids of the documents a Retrieve for `query` finds in `collection`.
async fn found(client: &mut Client, collection: &str, query: &str) -> Vec<String> {
    let response = client
        .retrieve(retrieve_request(collection, query, 512))
        .await
        .expect("retrieve")
        .into_inner();
    let mut ids: Vec<String> = response.chunks.into_iter().map(|c| c.doc_id).collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Creates `count` collections, `per_collection` notes each, from 4 clients at once.
async fn create_and_fill(client: &Client, count: usize, per_collection: usize) {
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (worker..count).step_by(4) {
                let name = collection_name(i);
                create_collection(&mut client, &name).await;
                for n in 0..per_collection {
                    upsert_one(&mut client, &name, note(&format!("n{n}"), "invoices"))
                        .await
                        .expect("upsert");
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_collections_hold_no_writer_threads_and_no_open_files() {
    const COLLECTIONS: usize = 200;
    // An empty server, connected and asked once: the baseline.
    let empty_dir = tempfile::tempdir().unwrap();
    let empty = binary::start(empty_dir.path(), &lexical(&[]));
    let mut client = binary::connect(&empty.address).await;
    client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .expect("list");
    let baseline = usage(&empty);
    drop(client);
    stop(empty);

    let dir = tempfile::tempdir().unwrap();
    let server = binary::start(dir.path(), &lexical(&[]));
    let client = binary::connect(&server.address).await;
    create_and_fill(&client, COLLECTIONS, 1).await;
    drop(client);
    stop(server);

    // After a restart every collection is open and answers, and none has been written.
    let server = binary::start(dir.path(), &lexical(&[]));
    let mut client = binary::connect(&server.address).await;
    for i in 0..COLLECTIONS {
        let stats = collection_stats(&mut client, &collection_name(i)).await;
        assert_eq!(stats.documents, 1, "{} lost its note", collection_name(i));
    }
    assert_eq!(
        found(&mut client, &collection_name(COLLECTIONS - 1), "invoices").await,
        ["n0"]
    );
    let idle = usage(&server);
    // A thread or a descriptor per collection would be 200 more of each.
    assert!(
        idle.threads <= baseline.threads + 4,
        "{COLLECTIONS} idle collections: {} threads; an empty server has {}",
        idle.threads,
        baseline.threads
    );
    assert!(
        idle.fds <= baseline.fds + 8,
        "{COLLECTIONS} idle collections: {} open descriptors; an empty server has {}",
        idle.fds,
        baseline.fds
    );
    assert_eq!(metric(&server, "lathe_index_writers_open"), 0);
    stop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_burst_of_writes_to_many_collections_the_writers_close_and_threads_fall_back() {
    const COLLECTIONS: usize = 24;
    const MAX_OPEN_WRITERS: u64 = 4;
    // Tantivy's writer: `storage.indexing_threads` (2 by default) indexing threads, each with
    // its doc store's compressor thread while it writes a segment, the segment updater, one merge
    // thread.
    const THREADS_PER_WRITER: u64 = 2 * 2 + 2;
    let dir = tempfile::tempdir().unwrap();
    let server = binary::start(
        dir.path(),
        &lexical(&[
            ("LATHE_STORAGE__WRITER_IDLE_MS", "200"),
            ("LATHE_STORAGE__MAX_OPEN_WRITERS", "4"),
        ]),
    );
    let mut client = binary::connect(&server.address).await;
    for i in 0..COLLECTIONS {
        create_collection(&mut client, &collection_name(i)).await;
    }
    let before = usage(&server);

    // A sampler records the most writer threads seen while every collection is written at once
    // (counted by their names: the runtime's blocking pool grows and shrinks with the load of
    // the machine, and is not what the limit bounds).
    let pid = server.child.id();
    let (stop_sampling, sampling) = std::sync::mpsc::channel::<()>();
    let sampler = std::thread::spawn(move || {
        let mut most = 0u64;
        while sampling.try_recv().is_err() {
            most = most.max(writer_threads(pid));
            std::thread::sleep(Duration::from_millis(5));
        }
        most
    });
    let mut tasks = Vec::new();
    for i in 0..COLLECTIONS {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..5 {
                upsert_one(
                    &mut client,
                    &collection_name(i),
                    note(&format!("n{n}"), "burst"),
                )
                .await
                .expect("upsert during the burst");
            }
        }));
    }
    for task in tasks {
        task.await.expect("burst task");
    }
    stop_sampling.send(()).unwrap();
    let most_threads = sampler.join().unwrap();

    // More collections were written at once than writers may be open: some were closed to
    // make room, and every write still landed.
    assert!(metric(&server, "lathe_index_writer_evictions_total") > 0);
    for i in 0..COLLECTIONS {
        let stats = collection_stats(&mut client, &collection_name(i)).await;
        assert_eq!(stats.documents, 5, "{}", collection_name(i));
    }
    assert!(most_threads > 0, "the sampler saw the writers' threads");
    assert!(
        most_threads <= MAX_OPEN_WRITERS * THREADS_PER_WRITER,
        "{most_threads} writer threads during the burst; at most {MAX_OPEN_WRITERS} writers of {THREADS_PER_WRITER} threads"
    );
    // Idle again: the writers close, their threads and lock files go.
    wait_until("every writer closed", Duration::from_secs(60), || {
        metric(&server, "lathe_index_writers_open") == 0
    });
    wait_until(
        "threads and descriptors back to their level before the burst",
        Duration::from_secs(60),
        || {
            let now = usage(&server);
            now.threads <= before.threads + 2 && now.fds <= before.fds + 2
        },
    );
    stop(server);
}

/// Memory maps of process `pid` (`/proc/PID/maps` lines): each open collection maps its index
/// files, and the kernel allows a process `vm.max_map_count` of them.
fn memory_maps(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("/proc maps")
        .lines()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_open_collections_idle_ones_close_so_maps_stay_bounded_and_all_answer() {
    const COLLECTIONS: usize = 80;
    const MAX_OPEN: usize = 8;
    // Static vectors: a closed collection's dense index is sealed at its close and loaded again.
    let budget = [
        ("LATHE_MODELS__DENSE", "static".to_string()),
        ("LATHE_STORAGE__MAX_OPEN_COLLECTIONS", "8".to_string()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let server = binary::start(dir.path(), &budget);
    let empty_maps = memory_maps(server.child.id());
    let mut client = binary::connect(&server.address).await;
    create_and_fill(&client, COLLECTIONS, 1).await;
    wait_until("back within the budget", Duration::from_secs(60), || {
        metric(&server, "lathe_collections_open") <= MAX_OPEN as i64
    });
    // An open collection maps 6 or more files; all 80 open would be 480 maps or more.
    let bounded = |maps: usize| maps < empty_maps + 3 * COLLECTIONS;
    let maps = memory_maps(server.child.id());
    assert!(
        bounded(maps),
        "{maps} maps with {COLLECTIONS} collections; {empty_maps} empty"
    );
    assert!(metric(&server, "lathe_collection_closes_total") >= (COLLECTIONS - MAX_OPEN) as i64);
    // Series per collection only for the open ones: a scrape does not grow with the tenants.
    let documents = series(&server, "lathe_collection_documents");
    assert!(
        (1..=MAX_OPEN + MAX_OPEN / 4).contains(&documents),
        "{documents} lathe_collection_documents series"
    );
    assert_eq!(
        metric(&server, "lathe_collections{state=\"ready\"}"),
        COLLECTIONS as i64
    );
    // A closed collection is listed as ready, and answers once opened.
    let listed = client
        .list_collections(proto::ListCollectionsRequest {})
        .await
        .expect("list")
        .into_inner()
        .collections;
    assert_eq!(listed.len(), COLLECTIONS);
    assert!(listed
        .iter()
        .all(|c| c.state == proto::CollectionState::Ready as i32));
    assert_eq!(
        found(&mut client, &collection_name(0), "invoices").await,
        ["n0"]
    );
    // Closed in this process, sealed, then opened again by that Retrieve.
    let stats = collection_stats(&mut client, &collection_name(0)).await;
    let dense = stats.dense.expect("static vectors");
    assert_eq!((dense.vectors, dense.sections_with_vector), (1, 1));
    drop(client);
    stop(server);

    // After a restart the first eight by name are open; every other opens when asked.
    let server = binary::start(dir.path(), &budget);
    assert_eq!(metric(&server, "lathe_collections_open"), MAX_OPEN as i64);
    let mut client = binary::connect(&server.address).await;
    for i in (0..COLLECTIONS).rev() {
        let stats = collection_stats(&mut client, &collection_name(i)).await;
        assert_eq!(stats.documents, 1, "{} lost its note", collection_name(i));
        let dense = stats.dense.expect("static vectors");
        assert_eq!(
            (dense.vectors, dense.sections_with_vector),
            (stats.sections, stats.sections),
            "{}: lexical and dense indexes disagree after its open",
            collection_name(i)
        );
    }
    assert_eq!(
        found(&mut client, &collection_name(40), "invoices").await,
        ["n0"]
    );
    wait_until("back within the budget", Duration::from_secs(60), || {
        metric(&server, "lathe_collections_open") <= MAX_OPEN as i64
    });
    let maps = memory_maps(server.child.id());
    assert!(
        bounded(maps),
        "{maps} maps after every collection answered; {empty_maps} empty"
    );
    stop(server);
}

/// A server whose `collections` folder is a tmpfs of `size`, with collection `c` holding the
/// note `kept`. Writers close after 200 ms idle, so a remount finds no file open for writing.
async fn server_on_tmpfs(root: &Path, size: &str) -> (Tmpfs, Server, Client) {
    let data_dir = root.join("data");
    let mut mount = Tmpfs::mount(&data_dir.join("collections"), size);
    let server = binary::start(
        &data_dir,
        &lexical(&[("LATHE_STORAGE__WRITER_IDLE_MS", "200")]),
    );
    mount.server_pid = Some(server.child.id());
    let mut client = binary::connect(&server.address).await;
    create_collection(&mut client, "c").await;
    upsert_one(&mut client, "c", note("kept", "lanterns"))
        .await
        .expect("the first write");
    (mount, server, client)
}

/// The write is refused with `code`, naming the collection, a path under `folder` and `cause`.
fn assert_storage_error(result: Result<(), tonic::Status>, code: Code, folder: &Path, cause: &str) {
    let status = result.expect_err("the write must fail");
    let message = status.message();
    assert_eq!(status.code(), code, "{message}");
    assert!(message.contains("collection `c`"), "{message}");
    assert!(message.contains(&folder.display().to_string()), "{message}");
    assert!(message.contains(cause), "{message}");
    assert!(!message.contains("killed"), "{message}");
}

/// Fills the filesystem of `folder` to the last byte; returns the filler file.
fn fill(folder: &Path) -> PathBuf {
    use std::io::Write;
    let path = folder.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    for chunk in [1 << 20, 4096, 1] {
        let bytes = vec![0u8; chunk];
        while file.write_all(&bytes).is_ok() {}
    }
    let _ = file.sync_all();
    path
}

/// The first write after the disk stopped taking the collection's files: it is in the write
/// queue (durable, outside the collection's folder), but cannot be applied, so a `wait` for it
/// ends at its deadline naming its operation. Returns the operation, once its worker says why it
/// is retrying (the disk's error), after which the collection takes no new writes.
async fn queued_behind_the_disk(client: &mut Client, doc: proto::Document, cause: &str) -> u64 {
    let mut request = tonic::Request::new(proto::UpsertDocumentsRequest {
        collection: "c".to_string(),
        documents: vec![doc],
        wait: true,
        write_id: String::new(),
    });
    request.set_timeout(Duration::from_secs(3));
    let status = client
        .upsert_documents(request)
        .await
        .expect_err("the write cannot be applied");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("queued as operation"),
        "{status:?}"
    );
    let id = queued_operation_id(&status);
    let started = Instant::now();
    loop {
        let operation = client
            .get_operation(proto::GetOperationRequest { id })
            .await
            .unwrap()
            .into_inner();
        if operation.error.contains(cause) {
            assert!(operation.error.starts_with("retrying: "), "{operation:?}");
            return id;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{operation:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn queued_operation_id(status: &tonic::Status) -> u64 {
    use tonic_types::StatusExt;
    let details = status.get_error_details();
    details.error_info().expect("ErrorInfo details").metadata["operation_id"]
        .parse()
        .unwrap()
}

/// Sends `doc` until the collection takes it (the worker finds the disk writable again on the
/// try a refused write starts, or within its backoff); at most `limit`.
async fn upsert_once_writable(client: &mut Client, doc: proto::Document, limit: Duration) {
    let started = Instant::now();
    loop {
        match upsert_one(client, "c", doc.clone()).await {
            Ok(()) => return,
            Err(status) => assert!(
                started.elapsed() < limit,
                "still refused after {limit:?}: {status:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_resource_exhausted_and_writes_resume_when_space_returns() {
    let root = tempfile::tempdir().unwrap();
    let (mount, server, mut client) = server_on_tmpfs(root.path(), "16m").await;
    let filler = fill(&mount.path);

    // The first write is queued (the queue lives outside the full folder) and waits for space.
    let queued = queued_behind_the_disk(
        &mut client,
        note("queued-1", "lanterns"),
        "No space left on device",
    )
    .await;
    // Then every write says what is wrong, and nothing of it is stored.
    for id in ["lost-1", "lost-2", "lost-3"] {
        let result = upsert_one(&mut client, "c", note(id, "lanterns")).await;
        assert_storage_error(
            result,
            Code::ResourceExhausted,
            &mount.path,
            "No space left on device",
        );
    }
    // Reads go on.
    assert_eq!(found(&mut client, "c", "lanterns").await, ["kept"]);
    assert_eq!(collection_stats(&mut client, "c").await.documents, 1);

    std::fs::remove_file(filler).unwrap();
    upsert_once_writable(
        &mut client,
        note("after", "lanterns"),
        Duration::from_secs(30),
    )
    .await;
    // The queued write was applied once space returned; the refused ones never were.
    let operation = client
        .get_operation(proto::GetOperationRequest { id: queued })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        proto::OperationState::try_from(operation.state).unwrap(),
        proto::OperationState::Applied,
        "{operation:?}"
    );
    assert_eq!(
        found(&mut client, "c", "lanterns").await,
        ["after", "kept", "queued-1"]
    );
    stop(server);
    let server = binary::start(&root.path().join("data"), &lexical(&[]));
    let mut client = binary::connect(&server.address).await;
    assert_eq!(
        found(&mut client, "c", "lanterns").await,
        ["after", "kept", "queued-1"]
    );
    stop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_filesystem_answers_failed_precondition_and_reads_go_on_across_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let (mut mount, server, mut client) = server_on_tmpfs(root.path(), "64m").await;
    // A remount read-only needs every file closed for writing: the idle writer closes.
    wait_until("the writer closed", Duration::from_secs(60), || {
        metric(&server, "lathe_index_writers_open") == 0
    });
    mount.remount("ro");

    let queued = queued_behind_the_disk(
        &mut client,
        note("queued-1", "lanterns"),
        "Read-only file system",
    )
    .await;
    for id in ["lost-1", "lost-2"] {
        let result = upsert_one(&mut client, "c", note(id, "lanterns")).await;
        assert_storage_error(
            result,
            Code::FailedPrecondition,
            &mount.path,
            "Read-only file system",
        );
    }
    assert_eq!(found(&mut client, "c", "lanterns").await, ["kept"]);

    // Started on the read-only filesystem, the server serves reads, takes up the queued write
    // (which the disk refuses again), and refuses new writes alike.
    stop(server);
    let server = binary::start(&root.path().join("data"), &lexical(&[]));
    mount.server_pid = Some(server.child.id());
    let mut client = binary::connect(&server.address).await;
    assert_eq!(found(&mut client, "c", "lanterns").await, ["kept"]);
    let started = Instant::now();
    loop {
        let operation = client
            .get_operation(proto::GetOperationRequest { id: queued })
            .await
            .expect("the queued write is kept across the restart")
            .into_inner();
        if operation.error.contains("Read-only file system") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{operation:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let result = upsert_one(&mut client, "c", note("lost-3", "lanterns")).await;
    assert_storage_error(
        result,
        Code::FailedPrecondition,
        &mount.path,
        "Read-only file system",
    );

    mount.remount("rw");
    upsert_once_writable(
        &mut client,
        note("after", "lanterns"),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        found(&mut client, "c", "lanterns").await,
        ["after", "kept", "queued-1"]
    );
    stop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immutable_index_folder_answers_failed_precondition_with_the_cause() {
    let root = tempfile::tempdir().unwrap();
    let (mount, server, mut client) = server_on_tmpfs(root.path(), "64m").await;
    let index_folder = mount.path.join("c/index");
    run("chattr", &["+i"], &index_folder);

    queued_behind_the_disk(
        &mut client,
        note("queued-1", "lanterns"),
        "Operation not permitted",
    )
    .await;
    for id in ["lost-1", "lost-2"] {
        let result = upsert_one(&mut client, "c", note(id, "lanterns")).await;
        assert_storage_error(
            result,
            Code::FailedPrecondition,
            &index_folder,
            "Operation not permitted",
        );
    }
    assert_eq!(found(&mut client, "c", "lanterns").await, ["kept"]);

    run("chattr", &["-i"], &index_folder);
    upsert_once_writable(
        &mut client,
        note("after", "lanterns"),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        found(&mut client, "c", "lanterns").await,
        ["after", "kept", "queued-1"]
    );
    stop(server);
}
