//! The work queue of a replicated deployment (see `replication::work`): real `lathe serve`
//! replicas (static vectors) and a real `nats-server -js` on loopback.
//!
//! - A write without `wait` is acknowledged once queued, with a work token; a replica that runs no
//!   index worker still gets it applied, by another replica's worker, and reads it with the token.
//! - Order holds across workers: a queued write that a worker takes only after a newer write of
//!   the same document was published leaves the newer version in place.
//! - A write queued for a collection that is deleted, and made again, before a worker takes it is
//!   dropped: the new collection never shows the old collection's document.
//! - Past `ingest.max_queued_bytes_total` queued a write is refused whole (RESOURCE_EXHAUSTED),
//!   reads go on, and writes are taken again once workers drain the queue.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::nats::Nats;
use common::replica::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;

/// Tokens of queued writes start here (see `WriteResponse.consistency_token`).
const WORK_TOKEN: u64 = 1 << 62;

fn no_worker() -> Vec<(&'static str, String)> {
    vec![("LATHE_REPLICATION__INDEX_WORKER", "false".into())]
}

async fn upsert(
    client: &mut LatheClient<Channel>,
    collection: &str,
    documents: Vec<proto::Document>,
    wait: bool,
) -> u64 {
    client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: collection.into(),
            documents,
            wait,
            write_id: String::new(),
        })
        .await
        .expect("upsert")
        .into_inner()
        .consistency_token
}

/// The text of document `id`'s chunks, read at `token`.
async fn text_of_document(
    client: &mut LatheClient<Channel>,
    collection: &str,
    id: &str,
    token: u64,
) -> String {
    let mut request = read_at(collection, "document", token);
    request.token_budget = 32_768;
    request.filter = Some(proto::Filter {
        metadata: Vec::new(),
        doc_ids: vec![id.into()],
    });
    let reply = client.retrieve(request).await.expect("retrieve");
    let chunks = reply.into_inner().chunks;
    chunks
        .iter()
        .map(|c| c.text.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_are_applied_by_any_replicas_worker_in_order_and_never_into_a_new_collection()
{
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    // No worker anywhere yet: what is queued waits.
    let mut a = Replica::start_with(&dir.path().join("a"), &nats, &no_worker()).await;
    a.until_ready(Duration::from_secs(120)).await;
    create(&mut a.client, "docs").await;
    create(&mut a.client, "doomed").await;

    // Queued: acknowledged with a work token before any worker embedded it.
    let first = documents(0..10, 60);
    let queued = upsert(&mut a.client, "docs", first, false).await;
    assert!(queued >= WORK_TOKEN, "{queued}");
    let mut old = documents(0..1, 60);
    old[0].text = "An old version about the spindle.".into();
    let stale = upsert(&mut a.client, "docs", old, false).await;
    assert!(stale > queued);
    // A newer version of doc0, with wait: embedded here and published now, ahead of the queue.
    let mut new = documents(0..1, 60);
    new[0].text = "The newest version about the tailstock.".into();
    let direct = upsert(&mut a.client, "docs", new, true).await;
    assert!(
        direct < WORK_TOKEN,
        "a write with wait answers its log position"
    );
    assert_eq!(
        text_of_document(&mut a.client, "docs", "doc0", direct).await,
        "The newest version about the tailstock."
    );
    // Queued for a collection then deleted and made again.
    let doomed = upsert(&mut a.client, "doomed", documents(50..51, 40), false).await;
    a.client
        .delete_collection(proto::DeleteCollectionRequest {
            name: "doomed".into(),
        })
        .await
        .expect("delete collection");
    create(&mut a.client, "doomed").await;
    upsert(&mut a.client, "doomed", documents(60..61, 40), true).await;

    // Another replica's worker takes the queue; `a` reads every write with its token.
    let mut b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    let ids: Vec<String> = (0..10).map(|doc| format!("doc{doc}")).collect();
    let found = present(&mut a.client, "docs", &ids, queued).await;
    assert_eq!(found.len(), 10, "{found:?}");
    // The older queued version lost to the newer direct one, on every replica.
    for client in [&mut a.client, &mut b.client] {
        assert_eq!(
            text_of_document(client, "docs", "doc0", stale).await,
            "The newest version about the tailstock."
        );
        // Read once the worker has taken the doomed write (its work token).
        let found = present(client, "doomed", &["doc50".into(), "doc60".into()], doomed).await;
        assert_eq!(found, BTreeSet::from(["doc60".to_string()]));
    }
    b.log_line("a queued write is dropped: its collection was deleted");
}

/// Backpressure: past `ingest.max_queued_bytes_total` a write is refused whole with
/// RESOURCE_EXHAUSTED naming the bound, reads go on, and once workers drain the queue writes are
/// taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_work_streams_bound_a_write_is_refused_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut bounded = no_worker();
    bounded.push(("LATHE_INGEST__MAX_QUEUED_BYTES", "1048576".into()));
    bounded.push(("LATHE_INGEST__MAX_QUEUED_BYTES_TOTAL", "1048576".into()));
    let mut a = Replica::start_with(&dir.path().join("a"), &nats, &bounded).await;
    a.until_ready(Duration::from_secs(120)).await;
    create(&mut a.client, "docs").await;
    let mut accepted = 0;
    let refused = loop {
        let reply = a
            .client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: "docs".into(),
                documents: documents(accepted..accepted + 1, 8_000),
                wait: false,
                write_id: String::new(),
            })
            .await;
        match reply {
            Ok(_) => accepted += 1,
            Err(status) => break status,
        }
        assert!(accepted < 40, "1 MiB of writes queued and none refused");
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("ingest.max_queued_bytes_total")
            && refused.message().contains("nothing was stored"),
        "{refused:?}"
    );
    assert!(
        accepted >= 8,
        "only {accepted} writes of about 60 KB queued"
    );
    a.client
        .retrieve(read_at("docs", "document", 0))
        .await
        .expect("reads go on");
    // The queue's depth, as the watch reads it every 2 s.
    let depth = until_metric(&a, "lathe_replication_work_queue_messages", |m| m > 0.0).await;
    assert_eq!(depth, accepted as f64);
    assert!(metric(&a, "lathe_replication_work_queue_bytes") > 1e6 * 0.5);
    assert!(metric(&a, "lathe_replication_work_queue_oldest_seconds") > 0.0);
    // A worker drains the queue; the writes queued are applied, and a write is taken again.
    let _b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    let started = std::time::Instant::now();
    let token = loop {
        let reply = a
            .client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: "docs".into(),
                documents: documents(100..101, 20),
                wait: false,
                write_id: String::new(),
            })
            .await;
        match reply {
            Ok(reply) => break reply.into_inner().consistency_token,
            // As a client does with the refusal's retry delay, sooner.
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(started.elapsed() < Duration::from_secs(60), "never drained");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    let mut ids: Vec<String> = (0..accepted).map(|doc| format!("doc{doc}")).collect();
    ids.push("doc100".into());
    let found = present(&mut a.client, "docs", &ids, token).await;
    assert_eq!(found.len(), accepted + 1, "{found:?}");
    until_metric(&a, "lathe_replication_work_queue_messages", |m| m == 0.0).await;
    assert_eq!(
        metric(&a, "lathe_replication_work_queue_oldest_seconds"),
        0.0
    );
}

fn metric(replica: &Replica, name: &str) -> f64 {
    let body = common::binary::scrape_metrics(&replica.server.metrics_address);
    body.lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

/// `name`'s value once `wanted` holds for it (within 20 s).
async fn until_metric(replica: &Replica, name: &str, wanted: impl Fn(f64) -> bool) -> f64 {
    let started = std::time::Instant::now();
    loop {
        let value = metric(replica, name);
        if wanted(value) {
            return value;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name} stays {value}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A write queued before the log is lost and taken only after an operator re-seeded it: the
/// recovered log made the collection again (another incarnation), and the write is applied to
/// it, not dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_queued_before_the_log_was_lost_is_applied_once_it_is_reseeded() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut a = Replica::start_with(&dir.path().join("a"), &nats, &no_worker()).await;
    a.until_ready(Duration::from_secs(120)).await;
    // A collection made and deleted first: `c`'s position in the recovered log is not the one
    // it had in the lost log.
    create(&mut a.client, "gone").await;
    a.client
        .delete_collection(proto::DeleteCollectionRequest {
            name: "gone".into(),
        })
        .await
        .expect("delete collection");
    create(&mut a.client, "c").await;
    let first = upsert(&mut a.client, "c", documents(0..1, 40), true).await;
    let queued = upsert(&mut a.client, "c", documents(1..3, 40), false).await;
    assert!(first < WORK_TOKEN && queued >= WORK_TOKEN);

    let client = async_nats::connect(nats.url()).await.expect("connect");
    async_nats::jetstream::new(client)
        .delete_stream("LATHE")
        .await
        .expect("delete the log");
    until_lost(&a).await;
    let (ok, output) = replicas_command(&a.server.address, &["reseed", "--stream", "LATHE"]).await;
    assert!(ok, "{output}");

    // Only now a worker: the write it takes names the lost log.
    let mut b = Replica::start_ready(&dir.path().join("b"), &nats).await;
    let ids: Vec<String> = (0..3).map(|doc| format!("doc{doc}")).collect();
    for client in [&mut a.client, &mut b.client] {
        let found = present(client, "c", &ids, queued).await;
        assert_eq!(found.len(), 3, "{found:?}");
    }
}
