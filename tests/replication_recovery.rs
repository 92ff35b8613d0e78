//! Recovering a lost write log (real `nats-server -js` on loopback, real `lathe serve` replicas,
//! static vectors; docs/faults.md rows 48–49): the operator's two commands.
//!
//! - `lathe replicas reseed`: the stream deleted under two replicas, one of which was down and
//!   behind; the log is re-seeded from the one that has everything, and both converge to it:
//!   SERVING again, every document and alias on both, the same answers at the same position,
//!   writes taken and applied everywhere; a third replica, down from before the loss until
//!   after the recovery, adopts the new log when it starts; a new replica bootstraps from it.
//! - `lathe replicas start-over`: the stream purged; refused while the log is not lost, or without
//!   the stream's name; then every replica drops what the lost log made and serves an empty log
//!   that takes new collections.

mod common;

use std::time::{Duration, Instant};

use common::binary;
use common::nats::Nats;
use common::replica::*;
use lathe::api::proto;
use tonic_health::pb::health_check_response::ServingStatus;

fn ids(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|doc| format!("doc{doc}")).collect()
}

async fn until_serving(replica: &Replica, limit: Duration) -> Duration {
    let started = Instant::now();
    while replica.health().await != ServingStatus::Serving {
        assert!(started.elapsed() < limit, "not SERVING within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

/// The chunks of one Retrieve (ids, offsets, text, scores), read at `token`.
async fn answer(replica: &mut Replica, query: &str, token: u64) -> (Vec<String>, u64) {
    let reply = replica
        .client
        .retrieve(read_at("c", query, token))
        .await
        .expect("retrieve")
        .into_inner();
    let chunks = reply
        .chunks
        .iter()
        .map(|chunk| {
            format!(
                "{} {:?} {:.6} {}",
                chunk.doc_id,
                chunk.bytes.as_ref().map(|span| (span.start, span.end)),
                chunk.score,
                chunk.text
            )
        })
        .collect();
    (chunks, reply.log_position)
}

async fn stream_exists(nats: &Nats) -> bool {
    let client = async_nats::connect(nats.url()).await.expect("connect");
    async_nats::jetstream::new(client)
        .get_stream("LATHE")
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_log_is_reseeded_from_one_replica_and_every_replica_converges_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut a = Replica::start_ready(&dir.path().join("a"), &nats).await;
    let mut b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    let mut c = Replica::start_ready(&dir.path().join("c"), &nats).await;
    create(&mut a.client, "c").await;
    let token = write(&mut a.client, "c", documents(0..10, 40)).await;
    for replica in [&mut b, &mut c] {
        let found = present(&mut replica.client, "c", &ids(0..10), token).await;
        assert_eq!(found.len(), 10);
    }
    // c is down from before the loss until after the recovery (a rolling restart).
    c.kill();
    a.client
        .create_alias(proto::CreateAliasRequest {
            alias: "live".into(),
            collection: "c".into(),
        })
        .await
        .expect("create alias");
    // b goes down and falls behind: only a holds documents 10..15 and the new version of doc0.
    b.kill();
    let mut newer = documents(10..15, 40);
    newer.extend(documents(100..101, 40).into_iter().map(|mut document| {
        document.id = "doc0".into();
        document
    }));
    let token = write(&mut a.client, "c", newer).await;
    assert_eq!(
        present(&mut a.client, "c", &ids(0..15), token).await.len(),
        15
    );

    let client = async_nats::connect(nats.url()).await.expect("connect");
    async_nats::jetstream::new(client)
        .delete_stream("LATHE")
        .await
        .expect("delete the stream");
    until_lost(&a).await;
    let mut b = Replica::start(&dir.path().join("b"), &nats).await;
    until_lost(&b).await;
    assert!(
        !stream_exists(&nats).await,
        "no replica made the stream again"
    );

    // Refused without the stream's name, or with another.
    let (ok, output) = replicas_command(&a.server.address, &["reseed"]).await;
    assert!(!ok && output.contains("--stream"), "{output}");
    let (ok, output) = replicas_command(&a.server.address, &["reseed", "--stream", "OTHER"]).await;
    assert!(
        !ok && output.contains("confirm_stream") && output.contains("LATHE"),
        "{output}"
    );

    let started = Instant::now();
    let (ok, output) = replicas_command(&a.server.address, &["reseed", "--stream", "LATHE"]).await;
    assert!(ok, "{output}");
    assert!(
        output.contains("1 collections, 15 documents, 1 aliases")
            && output.contains("serves the new log"),
        "{output}"
    );
    let converged = until_serving(&b, Duration::from_secs(60)).await;
    println!(
        "re-seeded and both SERVING {:?} after the command",
        started.elapsed()
    );
    println!("b SERVING {converged:?} after a");
    for replica in [&a, &b] {
        let adopted = replica.log_line("adopted the recovered write log");
        assert!(
            adopted.contains("WARN") && adopted.contains("re-seeded"),
            "{adopted}"
        );
    }

    // Both hold exactly a's data: every document, doc0's newer version, the alias.
    for replica in [&mut a, &mut b] {
        assert_eq!(
            present(&mut replica.client, "c", &ids(0..15), 0)
                .await
                .len(),
            15
        );
        let through_alias = replica
            .client
            .retrieve(read_at("live", "Document 100", 0))
            .await
            .expect("retrieve through the alias")
            .into_inner();
        assert_eq!(through_alias.chunks[0].doc_id, "doc0");
        assert!(through_alias.chunks[0].text.contains("Document 100"));
        let body = binary::scrape_metrics(&replica.server.metrics_address);
        assert!(body.contains("lathe_replication_log_lost 0"), "{body}");
    }
    // The same answers at the same position.
    for query in ["latstock gearbox", "Document 7", "coolant turret"] {
        let (on_a, at_a) = answer(&mut a, query, 0).await;
        let (on_b, at_b) = answer(&mut b, query, at_a).await;
        assert_eq!(at_a, at_b, "no write since: the same position");
        assert!(!on_a.is_empty());
        assert_eq!(on_a, on_b, "{query}");
    }

    // Writes are taken again, on either, and applied on both.
    let token = write(&mut b.client, "c", documents(20..22, 40)).await;
    assert_eq!(
        present(&mut a.client, "c", &ids(20..22), token).await.len(),
        2
    );
    // A replica that was down throughout adopts the new log when it starts.
    let mut c = Replica::start(&dir.path().join("c"), &nats).await;
    until_serving(&c, Duration::from_secs(60)).await;
    assert!(c
        .log_line("adopted the recovered write log")
        .contains("re-seeded"));
    let found = present(&mut c.client, "c", &ids(0..22), token).await;
    assert_eq!(found.len(), 17);
    // A new replica bootstraps from the new log.
    let mut fresh = Replica::start_ready(&dir.path().join("fresh"), &nats).await;
    assert_eq!(
        present(&mut fresh.client, "c", &ids(0..22), token)
            .await
            .len(),
        17
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_log_is_started_over_empty_and_every_replica_drops_what_it_held() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut a = Replica::start_ready(&dir.path().join("a"), &nats).await;
    let mut b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    create(&mut a.client, "c").await;
    let token = write(&mut a.client, "c", documents(0..5, 20)).await;
    assert_eq!(
        present(&mut b.client, "c", &ids(0..5), token).await.len(),
        5
    );

    // Refused while the log is fine: it would replace every replica's log.
    let status = b
        .client
        .recover_log(proto::RecoverLogRequest {
            recovery: proto::Recovery::StartOver.into(),
            confirm_stream: "LATHE".into(),
        })
        .await
        .expect_err("a recovery of a log that is not lost");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("not lost"), "{status:?}");

    let client = async_nats::connect(nats.url()).await.expect("connect");
    let mut stream = async_nats::jetstream::new(client)
        .get_stream("LATHE")
        .await
        .unwrap();
    stream.purge().await.expect("purge the stream");
    until_lost(&a).await;
    until_lost(&b).await;

    let (ok, output) =
        replicas_command(&b.server.address, &["start-over", "--stream", "LATHE"]).await;
    assert!(ok, "{output}");
    assert!(output.contains("0 collections, 0 documents"), "{output}");
    until_serving(&a, Duration::from_secs(60)).await;
    for replica in [&mut a, &mut b] {
        let listed = replica
            .client
            .list_collections(proto::ListCollectionsRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(listed.collections.is_empty(), "{listed:?}");
        assert!(replica
            .log_line("adopted the recovered write log")
            .contains("started over"));
    }
    // The log only holds its incarnation: the new one.
    let info = stream.info().await.unwrap();
    assert_eq!(info.state.messages, 1, "{info:?}");

    // The name is free again, on every replica.
    create(&mut b.client, "c").await;
    let token = write(&mut b.client, "c", documents(50..53, 20)).await;
    assert_eq!(
        present(&mut a.client, "c", &ids(0..60), token).await.len(),
        3
    );
}
