//! Graceful shutdown of the real binary: `lathe serve` gets SIGTERM while large upserts (with
//! `wait`) and Retrieves are in flight. Every request started before the signal completes OK, new
//! connections and new requests after it are not served, the process exits 0 on its own, and a
//! restart finds every acknowledged document.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::{Channel, Endpoint};

/// Documents per large upsert: enough that embedding them takes seconds, so the upserts are
/// still in flight when the signal arrives.
const BATCH_DOCUMENTS: usize = 40;
/// Generous so that a slow machine never turns the drain into a timeout.
const DRAIN_TIMEOUT_MS: u64 = 180_000;

struct Server {
    child: Child,
    address: String,
    metrics_address: String,
    /// Every log line the server writes, as it writes it.
    log: mpsc::Receiver<String>,
}

fn free_local_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().unwrap().to_string()
}

fn start(data_dir: &std::path::Path, drain_timeout_ms: u64) -> Server {
    let metrics_address = free_local_address();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lathe"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--models-dir",
        ])
        .arg(models_dir())
        .arg("--data-dir")
        .arg(data_dir)
        .env("LATHE_LOG__FILTER", "info")
        .env("LATHE_STORAGE__WRITER_MEMORY_BYTES", "16000000")
        .env("LATHE_SERVER__CPU_THREADS", "2")
        .env("LATHE_SERVER__METRICS_LISTEN", &metrics_address)
        .env(
            "LATHE_SERVER__DRAIN_TIMEOUT_MS",
            drain_timeout_ms.to_string(),
        )
        .env("LATHE_SERVER__REQUEST_TIMEOUT_MS", "600000")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn lathe serve");
    let stderr = child.stderr.take().unwrap();
    let (line_tx, log) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });
    // The server logs its bound address once indexes and models are loaded.
    let serving = wait_for_line(&log, "lathe serving", Duration::from_secs(120));
    let address = serving
        .split("\"address\":\"")
        .nth(1)
        .map(|rest| rest.chars().take_while(|c| *c != '"').collect::<String>())
        .expect("address in the serving line");
    Server {
        child,
        address,
        metrics_address,
        log,
    }
}

fn wait_for_line(log: &mpsc::Receiver<String>, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(error) => panic!("no log line with `{needle}`: {error}"),
        }
    }
}

async fn connect(address: &str) -> LatheClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    LatheClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// `lathe_requests_in_flight` from the Prometheus endpoint (a plain HTTP/1.0 GET).
fn requests_in_flight(metrics_address: &str) -> i64 {
    let mut stream = std::net::TcpStream::connect(metrics_address).expect("metrics connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: lathe\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("metrics response");
    body.lines()
        .find_map(|line| line.strip_prefix("lathe_requests_in_flight "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no lathe_requests_in_flight in\n{body}"))
}

/// Deterministic prose: sentences of words drawn from a fixed vocabulary, plus a word that only
/// this batch uses, so a Retrieve after the restart can find it.
fn batch(tag: &str, count: usize) -> Vec<proto::Document> {
    const WORDS: &[&str] = &[
        "river", "engine", "copper", "lantern", "harbor", "meadow", "signal", "quarry", "orchard",
        "ledger", "compass", "timber", "furnace", "glacier", "valley", "beacon", "mill", "canal",
        "thread", "anvil", "granite", "pillar", "ferry", "market",
    ];
    let mut seed = 0x9e37_79b9_u64 ^ tag.len() as u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    (0..count)
        .map(|doc| {
            let mut text = String::new();
            for sentence in 0..12 {
                text.push_str(&format!("Note {sentence} on {tag}word"));
                for _ in 0..14 {
                    text.push(' ');
                    text.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
                }
                text.push_str(".\n");
            }
            document(&format!("{tag}-{doc}"), &text, proto::DocumentFormat::Plain)
        })
        .collect()
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM failed: {status}");
}

fn wait_for_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for lathe") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("lathe did not exit within {limit:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_in_flight_requests_refuses_new_ones_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), DRAIN_TIMEOUT_MS);
    let mut setup = connect(&server.address).await;
    for name in ["a", "b", "small"] {
        create_collection(&mut setup, name).await;
    }
    upsert(&mut setup, "small", batch("small", 20)).await;

    // Two large upserts, each on its own connection, and Retrieves on a third connection.
    let started = Instant::now();
    let mut upserts = Vec::new();
    for name in ["a", "b"] {
        let mut client = connect(&server.address).await;
        let documents = batch(name, BATCH_DOCUMENTS);
        upserts.push(tokio::spawn(async move {
            client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: name.to_string(),
                    documents,
                    wait: true,
                })
                .await
        }));
    }
    let mut reader = connect(&server.address).await;
    // Started once the upserts hold the CPU pool, so they queue behind the embedding.
    while requests_in_flight(&server.metrics_address) < 2 {
        assert!(
            upserts.iter().all(|task| !task.is_finished()),
            "an upsert finished before both were in flight; make BATCH_DOCUMENTS larger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut retrieves = Vec::new();
    for query in ["river engine", "copper lantern harbor", "smallword ledger"] {
        let mut client = reader.clone();
        let request = retrieve_request("small", query, 512);
        retrieves.push(tokio::spawn(async move { client.retrieve(request).await }));
    }
    // Every request the client has not seen answered is on the server.
    loop {
        let unanswered = upserts.iter().filter(|task| !task.is_finished()).count()
            + retrieves.iter().filter(|task| !task.is_finished()).count();
        if requests_in_flight(&server.metrics_address) as usize >= unanswered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let unfinished_upserts = upserts.iter().filter(|task| !task.is_finished()).count();
    let unfinished_retrieves = retrieves.iter().filter(|task| !task.is_finished()).count();
    assert_eq!(
        unfinished_upserts, 2,
        "both upserts must be in flight at the signal; make BATCH_DOCUMENTS larger"
    );
    eprintln!(
        "SIGTERM {:?} after the upserts started, with {unfinished_upserts} upserts and \
         {unfinished_retrieves} retrieves in flight",
        started.elapsed()
    );
    sigterm(&server.child);
    let signalled = Instant::now();
    wait_for_line(&server.log, "shutdown requested", Duration::from_secs(30));

    // A new connection is refused (the listen socket is closed), not accepted and left hanging.
    let fresh = Endpoint::from_shared(format!("http://{}", server.address))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect()
        .await;
    match fresh {
        Err(error) => {
            let text = format!("{error:?}");
            assert!(
                text.contains("ConnectionRefused") || text.contains("Connection refused"),
                "a new connection after SIGTERM must be refused, got {text}"
            );
        }
        Ok(channel) => {
            let status = LatheClient::new(channel)
                .list_collections(proto::ListCollectionsRequest {})
                .await
                .expect_err("a new connection after SIGTERM must not be served");
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        }
    }
    // A new request on a connection that is draining is not served either.
    let late = tokio::time::timeout(
        Duration::from_secs(30),
        reader.list_collections(proto::ListCollectionsRequest {}),
    )
    .await
    .expect("a late request on a draining connection is answered, not left hanging");
    let late = late.expect_err("a new request after SIGTERM must not be served");
    // Unavailable when the client saw GOAWAY first, Cancelled ("connection closed") when the
    // connection closed under the request: refused by the transport either way.
    assert!(
        matches!(
            late.code(),
            tonic::Code::Unavailable | tonic::Code::Cancelled
        ),
        "{late:?}"
    );

    // Every request in flight at the signal completes OK.
    for (name, task) in ["a", "b"].into_iter().zip(upserts) {
        let response = task
            .await
            .unwrap()
            .unwrap_or_else(|status| panic!("in-flight upsert into {name} failed: {status:?}"))
            .into_inner();
        assert_eq!(response.documents as usize, BATCH_DOCUMENTS, "{name}");
    }
    for task in retrieves {
        let response = task
            .await
            .unwrap()
            .unwrap_or_else(|status| panic!("in-flight retrieve failed: {status:?}"))
            .into_inner();
        assert!(!response.chunks.is_empty(), "retrieve answered no chunks");
    }

    let status = wait_for_exit(
        &mut server.child,
        Duration::from_millis(DRAIN_TIMEOUT_MS + 60_000),
    );
    assert!(status.success(), "lathe exited with {status}");
    eprintln!("exited {:?} after SIGTERM", signalled.elapsed());
    let rest: Vec<String> = server.log.try_iter().collect();
    assert!(
        rest.iter().any(|line| line.contains("lathe stopped")),
        "no clean stop in the log: {rest:#?}"
    );
    assert!(
        !rest.iter().any(|line| line.contains("drain time over")),
        "the drain ran out of time: {rest:#?}"
    );

    // Everything acknowledged is committed: a restart finds it.
    let mut server = start(dir.path(), DRAIN_TIMEOUT_MS);
    let mut client = connect(&server.address).await;
    for name in ["a", "b"] {
        let stats = collection_stats(&mut client, name).await;
        assert_eq!(
            stats.documents as usize, BATCH_DOCUMENTS,
            "{name} after restart"
        );
        let found = retrieve(
            &mut client,
            retrieve_request(name, &format!("{name}word river"), 256),
        )
        .await;
        assert!(
            found
                .chunks
                .iter()
                .any(|chunk| chunk.text.contains(&format!("{name}word"))),
            "{name}: nothing of the upserted batch found after restart"
        );
    }
    sigterm(&server.child);
    let status = wait_for_exit(
        &mut server.child,
        Duration::from_millis(DRAIN_TIMEOUT_MS + 60_000),
    );
    assert!(status.success(), "idle lathe exited with {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_drain_time_runs_out_the_server_still_exits_0_and_reopens_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = connect(&server.address).await;
    create_collection(&mut client, "a").await;
    upsert(&mut client, "a", batch("first", 5)).await;
    let mut writer = client.clone();
    let documents = batch("late", BATCH_DOCUMENTS);
    let pending = tokio::spawn(async move {
        writer
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: "a".to_string(),
                documents,
                wait: true,
            })
            .await
    });
    while requests_in_flight(&server.metrics_address) < 1 {
        assert!(
            !pending.is_finished(),
            "the upsert finished before it was seen in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sigterm(&server.child);
    let status = wait_for_exit(&mut server.child, Duration::from_secs(120));
    assert!(status.success(), "lathe exited with {status}");
    let rest: Vec<String> = server.log.try_iter().collect();
    assert!(
        rest.iter().any(|line| line.contains("drain time over")),
        "the 1 ms drain should have run out: {rest:#?}"
    );
    // The cut-off upsert was never acknowledged; what was acknowledged before is there.
    let cut_off = pending.await.unwrap();
    assert!(
        cut_off.is_err(),
        "an upsert cut off by the drain must not be acknowledged"
    );
    let mut server = start(dir.path(), DRAIN_TIMEOUT_MS);
    let mut client = connect(&server.address).await;
    let stats = collection_stats(&mut client, "a").await;
    assert!(
        stats.documents as usize == 5 || stats.documents as usize == 5 + BATCH_DOCUMENTS,
        "{} documents: the unacknowledged batch must be all there or not at all",
        stats.documents
    );
    sigterm(&server.child);
    let status = wait_for_exit(&mut server.child, Duration::from_secs(120));
    assert!(status.success(), "idle lathe exited with {status}");
}
