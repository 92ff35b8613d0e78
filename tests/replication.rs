//! Replicas fed by the write log on NATS JetStream: real `lathe serve` processes (static vectors)
//! and a real `nats-server -js` on loopback (Debian's package; see `common::nats`).
//!
//! - Writes go to any replica, and every replica answers them once it has applied the write's
//!   consistency token; all replicas answer the same chunks, offsets and scores at the same log
//!   position; a version too large for one NATS message travels in parts.
//! - A replica killed with SIGKILL in the middle of a 1,000-document ingest converges after its
//!   restart, no document missing or doubled; a new replica with an empty data dir converges to
//!   the same answers.
//! - `nats-server` killed with SIGKILL during writes: every acknowledged write is there after it
//!   restarts, writes meanwhile get UNAVAILABLE naming the URL, reads never fail.
//! - An entry that cannot be decoded stops applying loudly (NOT_SERVING, an ERROR naming the
//!   entry, UNAVAILABLE for tokens past it), also after a restart: it is never skipped.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::binary;
use common::nats::Nats;
use common::replica::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// Tokens of writes queued in the work stream start here (see `WriteResponse.consistency_token`);
/// a write published directly answers its log position, below it.
const WORK_TOKEN: u64 = 1 << 62;

/// What must be the same on every replica at one log position: each chunk's every field (the
/// generation and timings are each replica's own).
async fn answers(
    client: &mut LatheClient<Channel>,
    collection: &str,
    queries: &[&str],
    token: u64,
) -> (Vec<Vec<proto::RetrievedChunk>>, u64) {
    let mut all = Vec::new();
    let mut position = 0;
    for query in queries {
        let reply = client
            .retrieve(read_at(collection, query, token))
            .await
            .expect("retrieve")
            .into_inner();
        if token < WORK_TOKEN {
            assert!(reply.log_position >= token, "answered before the token");
        }
        position = reply.log_position;
        assert!(!reply.chunks.is_empty(), "nothing for {query}");
        all.push(reply.chunks);
    }
    (all, position)
}

const QUERIES: [&str; 6] = [
    "spindle bearing",
    "which document is about the coolant",
    "tailriage carstock",
    "thread feed gearbox",
    "colret turlet",
    "lathe chuck",
];

/// Retries are safe on replicas too: a write sent three times with one `write_id`, to two
/// replicas, is stored once in the log (JetStream's `Nats-Msg-Id` deduplication), split versions
/// included; every answer carries the first one's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_write_id_sent_three_times_to_two_replicas_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    // A small max_payload, so that the large document travels in parts.
    let nats = Nats::start(dir.path(), Some(64 << 10));
    let mut a = Replica::start_ready(&dir.path().join("a"), &nats).await;
    let mut b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    create(&mut a.client, "docs").await;
    let request = proto::UpsertDocumentsRequest {
        collection: "docs".into(),
        documents: documents(0..3, 40),
        wait: false,
        write_id: "import-7".into(),
    };
    let mut tokens = Vec::new();
    for mut client in [a.client.clone(), b.client.clone(), a.client.clone()] {
        let reply = client
            .upsert_documents(request.clone())
            .await
            .expect("upsert")
            .into_inner();
        tokens.push(reply.consistency_token);
    }
    assert_eq!(tokens, [tokens[0]; 3], "one write in the log");
    // Nothing was stored by the repeats: the next entry comes right after the first write's.
    let next = write(&mut b.client, "docs", documents(10..11, 40)).await;
    assert_eq!(next, tokens[0] + 1, "the repeats stored nothing");
    // A version split into parts: the repeat stores no part, the first's stand.
    let mut big = documents(100..101, 30_000);
    big[0].id = "big".into();
    let big_request = proto::UpsertDocumentsRequest {
        collection: "docs".into(),
        documents: big,
        wait: false,
        write_id: "big-1".into(),
    };
    let mut big_tokens = Vec::new();
    for client in [&mut a.client, &mut b.client] {
        let reply = client.upsert_documents(big_request.clone()).await.unwrap();
        big_tokens.push(reply.into_inner().consistency_token);
    }
    assert_eq!(big_tokens[0], big_tokens[1]);
    let deleted = |client: &mut LatheClient<Channel>| {
        let mut client = client.clone();
        async move {
            client
                .delete_documents(proto::DeleteDocumentsRequest {
                    collection: "docs".into(),
                    ids: vec!["doc1".into()],
                    wait: false,
                    write_id: "cleanup-1".into(),
                })
                .await
                .expect("delete")
                .into_inner()
                .consistency_token
        }
    };
    let first_delete = deleted(&mut a.client).await;
    // The repeat stored none of its parts either: the next entry follows the split version's.
    assert_eq!(
        first_delete,
        big_tokens[0] + 1,
        "the repeated split write stored nothing"
    );
    assert_eq!(deleted(&mut b.client).await, first_delete);
    for replica in [&mut a, &mut b] {
        let ids = ["doc0", "doc1", "doc2", "doc10", "big"].map(String::from);
        let found: Vec<String> = present(&mut replica.client, "docs", &ids, first_delete)
            .await
            .into_iter()
            .collect();
        assert_eq!(found, ["big", "doc0", "doc10", "doc2"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_to_any_replica_and_every_replica_answers_them_alike() {
    let dir = tempfile::tempdir().unwrap();
    // A small max_payload, so that the large document below travels in parts.
    let nats = Nats::start(dir.path(), Some(64 << 10));
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas.push(Replica::start_ready(&dir.path().join(name), &nats).await);
    }
    create(&mut replicas[0].client, "docs").await;
    // The other replicas find the collection through the log, without a token.
    let from_b = write(&mut replicas[1].client, "docs", documents(0..20, 60)).await;
    let mut big = documents(100..101, 30_000);
    let big_text = big[0].text.clone();
    big[0].id = "big".into();
    let from_c = write(&mut replicas[2].client, "docs", big).await;
    let from_a = write(&mut replicas[0].client, "docs", documents(20..30, 60)).await;
    create(&mut replicas[2].client, "more").await;
    let more = write(&mut replicas[1].client, "more", documents(0..5, 40)).await;
    let deleted = delete(&mut replicas[0].client, "more", &["doc3"]).await;
    // Writes without `wait` are queued (their tokens grow with the work stream); the large
    // version (over one work message) and the delete are published directly.
    assert!(from_b >= WORK_TOKEN && from_a > from_b && more > from_a);
    assert!(
        from_c < WORK_TOKEN && deleted > from_c,
        "log positions grow with the log"
    );

    let ids: Vec<String> = (0..30).map(|doc| format!("doc{doc}")).collect();
    for replica in &mut replicas {
        for (token, wanted) in [(from_b, 0..20), (from_a, 20..30)] {
            let found = present(&mut replica.client, "docs", &ids[wanted.clone()], token).await;
            assert_eq!(found.len(), wanted.len(), "{found:?}");
        }
        // The split version arrived whole: its text at its offsets is the document's.
        let mut request = read_at("docs", "lathe", from_c);
        request.token_budget = 32_768;
        request.filter = Some(proto::Filter {
            metadata: Vec::new(),
            doc_ids: vec!["big".into()],
        });
        let reply = replica.client.retrieve(request).await.unwrap().into_inner();
        assert!(!reply.chunks.is_empty());
        for chunk in &reply.chunks {
            let bytes = chunk.bytes.unwrap();
            assert_eq!(
                chunk.text,
                big_text[bytes.start as usize..bytes.end as usize]
            );
        }
        let more_ids: Vec<String> = (0..5).map(|doc| format!("doc{doc}")).collect();
        let found = present(&mut replica.client, "more", &more_ids, deleted).await;
        assert_eq!(
            found,
            ["doc0", "doc1", "doc2", "doc4"].map(String::from).into()
        );
    }

    // Byte for byte the same at the same position.
    let (expected, position) = answers(&mut replicas[0].client, "docs", &QUERIES, deleted).await;
    let expected_stats = common::collection_stats(&mut replicas[0].client, "docs").await;
    assert_eq!(expected_stats.documents, 31);
    for replica in &mut replicas[1..] {
        let (got, got_position) = answers(&mut replica.client, "docs", &QUERIES, deleted).await;
        assert_eq!(got_position, position);
        assert_eq!(got, expected);
        let got_stats = common::collection_stats(&mut replica.client, "docs").await;
        assert_eq!(
            (
                got_stats.documents,
                got_stats.sections,
                got_stats.bytes,
                got_stats.dense
            ),
            (
                expected_stats.documents,
                expected_stats.sections,
                expected_stats.bytes,
                expected_stats.dense
            )
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_ingest_and_a_new_one_converge_to_the_same_answers() {
    const DOCUMENTS: usize = 1_000;
    const BATCH: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut writer = Replica::start_ready(&dir.path().join("writer"), &nats).await;
    let mut victim = Replica::start_ready(&dir.path().join("victim"), &nats).await;
    create(&mut writer.client, "bulk").await;

    let (mut token, mut token_at_kill) = (0, 0);
    for start in (0..DOCUMENTS).step_by(BATCH) {
        token = write(
            &mut writer.client,
            "bulk",
            documents(start..start + BATCH, 40),
        )
        .await;
        if start == 6 * BATCH {
            // Killed while it applies what the writer sends: what was written so far applied
            // and committed (it answered at the token), more on its way.
            victim
                .client
                .retrieve(read_at("bulk", "document", token))
                .await
                .expect("the victim reads the writes so far");
            victim.kill();
            // The log's head after the kill: a delete is published directly, and answers its
            // log position (the writes' tokens are the work stream's: see `replication::work`).
            token_at_kill = delete(&mut writer.client, "bulk", &["never-written"]).await;
        }
        if start == 12 * BATCH {
            victim = Replica::start(&dir.path().join("victim"), &nats).await;
            // It resumes after what it had committed, neither from the start nor past the kill.
            let from = victim.followed_from();
            assert!(
                from > 1 && from <= token_at_kill + 1,
                "resumed from {from}; the log was at {token_at_kill} just after it was killed"
            );
        }
    }
    let fresh = Replica::start(&dir.path().join("fresh"), &nats).await;
    let mut replicas = [writer, victim, fresh];
    for replica in &replicas {
        replica.until_ready(Duration::from_secs(180)).await;
    }
    let ids: Vec<String> = (0..DOCUMENTS).map(|doc| format!("doc{doc}")).collect();
    let (expected, position) = answers(&mut replicas[0].client, "bulk", &QUERIES, token).await;
    for replica in &mut replicas {
        let stats = common::collection_stats(&mut replica.client, "bulk").await;
        assert_eq!(
            (stats.documents, stats.sections),
            (1_000, 1_000),
            "{stats:?}"
        );
        let dense = stats.dense.expect("dense stats");
        assert_eq!((dense.vectors, dense.sections_with_vector), (1_000, 1_000));
        for chunk in ids.chunks(100) {
            let found = present(&mut replica.client, "bulk", chunk, token).await;
            assert_eq!(found.len(), chunk.len(), "missing documents");
        }
        let (got, got_position) = answers(&mut replica.client, "bulk", &QUERIES, token).await;
        assert_eq!((got_position, &got), (position, &expected));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_nats_kill_writes_meanwhile_fail_and_reads_never_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut nats = Nats::start(dir.path(), None);
    let mut writer = Replica::start_ready(&dir.path().join("writer"), &nats).await;
    let reader = Replica::start_ready(&dir.path().join("reader"), &nats).await;
    create(&mut writer.client, "c").await;
    write(&mut writer.client, "c", documents(0..1, 40)).await;

    // Reads on both replicas all along.
    let reading = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut readers = Vec::new();
    for client in [writer.client.clone(), reader.client.clone()] {
        let reading = std::sync::Arc::clone(&reading);
        readers.push(tokio::spawn(async move {
            let mut client = client;
            let mut reads = 0;
            while reading.load(std::sync::atomic::Ordering::SeqCst) {
                client
                    .retrieve(common::retrieve_request("c", "spindle", 256))
                    .await
                    .expect("a read failed");
                reads += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            reads
        }));
    }

    let mut acknowledged = Vec::new();
    let mut token = 0;
    let mut refused = 0;
    let mut doc = 1;
    let upsert_one = |client: &mut LatheClient<Channel>, doc: usize| {
        let mut client = client.clone();
        async move {
            client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: documents(doc..doc + 1, 40),
                    wait: false,
                    write_id: String::new(),
                })
                .await
        }
    };
    for phase in ["before", "outage", "after"] {
        let until = Instant::now() + Duration::from_secs(3);
        let mut outcomes = 0;
        while Instant::now() < until || (phase == "after" && outcomes < 20) {
            match upsert_one(&mut writer.client, doc).await {
                Ok(reply) => {
                    assert_ne!(
                        phase, "outage",
                        "a write was acknowledged while NATS was down"
                    );
                    token = token.max(reply.into_inner().consistency_token);
                    acknowledged.push(format!("doc{doc}"));
                    outcomes += 1;
                }
                Err(status) => {
                    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                    assert!(
                        status.message().contains(&nats.url()),
                        "{}",
                        status.message()
                    );
                    if phase == "outage" {
                        refused += 1;
                    }
                }
            }
            doc += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match phase {
            "before" => nats.kill(),
            "outage" => nats.restart(),
            _ => {}
        }
    }
    assert!(refused > 0, "no write was attempted during the outage");
    reading.store(false, std::sync::atomic::Ordering::SeqCst);
    for reads in readers {
        assert!(reads.await.expect("reader") > 10);
    }
    let mut writer_client = writer.client.clone();
    let mut reader_client = reader.client.clone();
    for client in [&mut writer_client, &mut reader_client] {
        for chunk in acknowledged.chunks(100) {
            let found = present(client, "c", chunk, token).await;
            let missing: Vec<_> = chunk.iter().filter(|id| !found.contains(*id)).collect();
            assert!(missing.is_empty(), "acknowledged but missing: {missing:?}");
        }
    }
}

/// A ready replica on `data_dir` with collection `c` holding `doc0`..`doc2`, and the token of
/// that write.
async fn replica_with_documents(data_dir: &Path, nats: &Nats) -> (Replica, u64) {
    let mut replica = Replica::start_ready(data_dir, nats).await;
    create(&mut replica.client, "c").await;
    let token = write(&mut replica.client, "c", documents(0..3, 40)).await;
    let ids = ["doc0".to_string(), "doc1".into(), "doc2".into()];
    assert_eq!(
        present(&mut replica.client, "c", &ids, token).await.len(),
        3
    );
    (replica, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_cannot_be_decoded_stops_applying_and_is_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let data_dir = dir.path().join("replica");
    let (mut replica, _) = replica_with_documents(&data_dir, &nats).await;

    // Garbage on a document subject of the log, as a broken or foreign writer would leave it.
    let client = async_nats::connect(nats.url())
        .await
        .expect("connect to nats");
    let poison = async_nats::jetstream::new(client)
        .publish(
            "lathe.log.doc.c.00000000000000000000000000000000",
            vec![0xff, 0x01, 0x02].into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored")
        .sequence;
    let line = binary::wait_for_line(&replica.server.log, "cannot apply", Duration::from_secs(30));
    assert!(
        line.contains("ERROR") && line.contains(&format!("entry {poison}")),
        "{line}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.health().await != ServingStatus::NotServing {
        assert!(
            Instant::now() < deadline,
            "still SERVING after a poison entry"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What it has is still served; a read past the poison entry cannot be.
    assert_eq!(
        present(&mut replica.client, "c", &["doc1".into()], 0)
            .await
            .len(),
        1
    );
    let status = replica
        .client
        .retrieve(read_at("c", "spindle", poison))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("stopped"), "{}", status.message());
    let metrics = binary::scrape_metrics(&replica.server.metrics_address);
    assert!(metrics.contains("lathe_replication_stopped 1"), "{metrics}");

    // After a restart it meets the same entry and stops again: never skipped.
    replica.kill();
    let restarted = Replica::start(&data_dir, &nats).await;
    let line = restarted.log_line("cannot apply");
    assert!(line.contains(&format!("entry {poison}")), "{line}");
    assert_eq!(restarted.health().await, ServingStatus::NotServing);
}

/// The stream deleted while the replica was down: restarted, it does not make the stream again
/// (its data came from the old one) but says the log is lost; a new replica with an empty data
/// dir makes a new log, and the old replica, restarted again, names it as another log. It
/// serves what it holds all along, and refuses writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_applied_from_another_log_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let data_dir = dir.path().join("replica");
    let (mut replica, _) = replica_with_documents(&data_dir, &nats).await;
    replica.kill();
    let client = async_nats::connect(nats.url())
        .await
        .expect("connect to nats");
    async_nats::jetstream::new(client)
        .delete_stream("LATHE")
        .await
        .expect("delete the stream");

    let mut restarted = Replica::start(&data_dir, &nats).await;
    let line = restarted.log_line("is lost");
    assert!(
        line.contains("ERROR") && line.contains("no longer exists"),
        "{line}"
    );
    assert_eq!(restarted.health().await, ServingStatus::NotServing);
    assert_write_refused(&mut restarted.client, "no longer exists").await;
    assert_eq!(
        present(&mut restarted.client, "c", &["doc0".into()], 0)
            .await
            .len(),
        1
    );
    restarted.kill();

    // A replica with nothing of a log makes a new one.
    let fresh = Replica::start_ready(&dir.path().join("fresh"), &nats).await;
    drop(fresh);
    let mut restarted = Replica::start(&data_dir, &nats).await;
    let line = restarted.log_line("is lost");
    assert!(
        line.contains("ERROR") && line.contains("was made again"),
        "{line}"
    );
    assert_eq!(restarted.health().await, ServingStatus::NotServing);
    assert_write_refused(&mut restarted.client, "was made again").await;
}

/// On a single node a write's consistency token is its place in the write queue (its operation
/// id), and a Retrieve that carries it answers once the write is visible; there is no log.
#[tokio::test]
async fn a_single_node_token_is_the_write_queue_position_and_no_log() {
    common::Fixture::lexical()
        .collection("c")
        .run(|served| async move {
            let mut client = served.client;
            let reply = client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: documents(0..1, 20),
                    wait: false,
                    write_id: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            let operation = reply
                .operation
                .expect("a single node's write has an operation");
            assert!(reply.consistency_token > 0);
            assert_eq!(reply.consistency_token, operation.id);
            let answer = common::retrieve(
                &mut client,
                read_at("c", "document", reply.consistency_token),
            )
            .await;
            assert!(!answer.chunks.is_empty(), "the token waits for the write");
            assert_eq!(answer.log_position, 0, "no log on a single node");
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_falls_behind_is_not_ready_until_it_has_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut writer = Replica::start_ready(&dir.path().join("writer"), &nats).await;
    // One entry a batch (a commit each) and a lag limit of one second: a follower paused while
    // 200 writes land is seconds behind when it resumes, and stays behind for as many commits.
    let mut variables = replica_variables(&nats.url());
    variables.push(("LATHE_REPLICATION__MAX_LAG_SECONDS", "1".into()));
    variables.push(("LATHE_REPLICATION__APPLY_BATCH", "1".into()));
    let follower = binary::start(&dir.path().join("follower"), &variables);
    let follower = Replica {
        client: binary::connect(&follower.address).await,
        server: follower,
    };
    follower.until_ready(Duration::from_secs(60)).await;
    create(&mut writer.client, "c").await;
    // What it logged while starting up (its first readiness lines) is not what is looked for.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while follower.server.log.try_recv().is_ok() {}
    let pid = follower.server.child.id();
    binary::signal(pid, "-STOP");
    let mut token = 0;
    for start in [0, 100] {
        token = write(&mut writer.client, "c", documents(start..start + 100, 30)).await;
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    binary::signal(pid, "-CONT");
    let line = binary::wait_for_line(
        &follower.server.log,
        "replica readiness",
        Duration::from_secs(30),
    );
    assert!(line.contains("\"ready\":false"), "{line}");
    let line = binary::wait_for_line(
        &follower.server.log,
        "replica readiness",
        Duration::from_secs(60),
    );
    assert!(line.contains("\"ready\":true"), "{line}");
    assert_eq!(follower.health().await, ServingStatus::Serving);
    let mut client = follower.client.clone();
    let ids: Vec<String> = (0..200).map(|doc| format!("doc{doc}")).collect();
    for chunk in ids.chunks(100) {
        assert_eq!(present(&mut client, "c", chunk, token).await.len(), 100);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_from_before_replication_stay_local_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node");
    // A single node with two collections, stopped cleanly.
    let mut single = binary::start(&data_dir, &[("LATHE_MODELS__DENSE", "static".into())]);
    let mut client = binary::connect(&single.address).await;
    for name in ["kept", "dropped"] {
        create(&mut client, name).await;
        common::upsert(&mut client, name, documents(0..2, 30)).await;
    }
    binary::sigterm(&single.child);
    assert!(binary::wait_for_exit(&mut single.child, Duration::from_secs(60)).success());

    // The same data dir as a replica: its collections are not in the log.
    let nats = Nats::start(dir.path(), None);
    let mut replica = Replica::start_ready(&data_dir, &nats).await;
    assert_eq!(
        present(&mut replica.client, "kept", &["doc1".into()], 0)
            .await
            .len(),
        1
    );
    let status = replica
        .client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: "kept".into(),
            documents: documents(5..6, 30),
            wait: false,
            write_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("before replication was on"),
        "{}",
        status.message()
    );
    // Deleted here (it is this replica's alone), and the name is free in the log.
    let deleted = replica
        .client
        .delete_collection(proto::DeleteCollectionRequest {
            name: "dropped".into(),
        })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(deleted.consistency_token, 0);
    create(&mut replica.client, "dropped").await;
    let token = write(&mut replica.client, "dropped", documents(7..8, 30)).await;
    assert_eq!(
        present(&mut replica.client, "dropped", &["doc7".into()], token)
            .await
            .len(),
        1
    );
}

/// The aliases `client`'s replica holds, as (alias, collection).
async fn aliases_on(client: &mut LatheClient<Channel>) -> Vec<(String, String)> {
    let aliases = client
        .list_aliases(proto::ListAliasesRequest {})
        .await
        .expect("list aliases")
        .into_inner()
        .aliases;
    aliases
        .into_iter()
        .map(|a| (a.alias, a.collection))
        .collect()
}

/// Waits (10 s at most) until `client`'s replica holds exactly `expected` as its aliases.
async fn until_aliases(client: &mut LatheClient<Channel>, expected: &[(&str, &str)]) {
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, c)| (a.to_string(), c.to_string()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = aliases_on(client).await;
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "aliases {now:?}, waiting for {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Aliases travel through the log: one made on a replica is seen and served on another, a switch
/// made there comes back, a delete reaches both, and a restarted replica keeps what it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_made_on_one_replica_is_seen_and_switched_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut a = Replica::start_ready(&dir.path().join("a"), &nats).await;
    let mut b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    create(&mut a.client, "v1").await;
    create(&mut a.client, "v2").await;
    write(&mut a.client, "v1", documents(0..3, 40)).await;
    let token = write(&mut a.client, "v2", documents(10..13, 40)).await;
    let (in_v1, in_v2): (Vec<String>, Vec<String>) = (
        (0..3).map(|i| format!("doc{i}")).collect(),
        (10..13).map(|i| format!("doc{i}")).collect(),
    );
    let all: Vec<String> = in_v1.iter().chain(&in_v2).cloned().collect();
    a.client
        .create_alias(proto::CreateAliasRequest {
            alias: "live".into(),
            collection: "v1".into(),
        })
        .await
        .expect("create the alias on a");
    until_aliases(&mut b.client, &[("live", "v1")]).await;
    let seen = present(&mut b.client, "live", &all, token).await;
    assert_eq!(seen, in_v1.iter().cloned().collect());

    b.client
        .switch_alias(proto::SwitchAliasRequest {
            alias: "live".into(),
            collection: "v2".into(),
        })
        .await
        .expect("switch the alias on b");
    until_aliases(&mut a.client, &[("live", "v2")]).await;
    let seen = present(&mut a.client, "live", &all, token).await;
    assert_eq!(seen, in_v2.iter().cloned().collect());
    let refused = a
        .client
        .delete_collection(proto::DeleteCollectionRequest { name: "v2".into() })
        .await
        .expect_err("v2 is named by an alias");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );

    // b restarts: it keeps the alias it applied, and applies what it missed.
    b.kill();
    a.client
        .create_alias(proto::CreateAliasRequest {
            alias: "old".into(),
            collection: "v1".into(),
        })
        .await
        .expect("create a second alias on a");
    let mut b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    until_aliases(&mut b.client, &[("live", "v2"), ("old", "v1")]).await;
    b.client
        .delete_alias(proto::DeleteAliasRequest {
            alias: "old".into(),
        })
        .await
        .expect("delete the alias on b");
    until_aliases(&mut a.client, &[("live", "v2")]).await;
}
