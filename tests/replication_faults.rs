//! Replicas that never lie, under what stalls and what an operator does to NATS by mistake (real
//! `nats-server -js` on loopback, real `lathe serve` replicas, static vectors; docs/faults.md
//! rows 36–41):
//!
//! - nats-server paused (SIGSTOP) for 30 s: replicas that cannot read the log stop vouching for
//!   their data (NOT_SERVING once they have not read it for `max_lag_seconds`); after SIGCONT a
//!   write is applied everywhere within 5 s, not after the consumer's 30 s pull expiry.
//! - A replica paused for 70 s while 2,000 writes land on another: no read it answers while
//!   SERVING misses a write stored more than `max_lag_seconds` before it, and it catches up.
//! - The stream purged, deleted, or nats-server restarted on an empty store: every running
//!   replica notices within 10 s (NOT_SERVING, one ERROR, `lathe_replication_log_lost` 1) and
//!   refuses writes with FAILED_PRECONDITION; nothing is acknowledged and then dropped.
//! - A stream whose subjects overlap the log's (`lathe` beside `LATHE`) stops the start with a
//!   message naming `replication.stream`.
//! - A replica whose disk fills while writes land on another: it stops applying with the
//!   storage error and reports NOT_SERVING at once, the other goes on, and once there is room
//!   it resumes by itself and holds every write.
//! - One node of a 3-node NATS cluster (the stream's leader, `stream_replicas = 3`) killed while
//!   a replica takes writes: writes resume within the cluster's election, nothing acknowledged
//!   is lost, every replica ends with every document.

mod common;

use std::time::{Duration, Instant};

use common::binary;
use common::nats::{Nats, NatsCluster};
use common::replica::*;
use common::tmpfs::Tmpfs;
use lathe::api::proto;
use tonic_health::pb::health_check_response::ServingStatus;

/// Replica settings of these tests: the defaults (the log read every 2 s) but
/// `max_lag_seconds`.
fn variables(nats: &Nats, max_lag_seconds: u64) -> Vec<(&'static str, String)> {
    let mut variables = replica_variables(&nats.url());
    variables.push((
        "LATHE_REPLICATION__MAX_LAG_SECONDS",
        max_lag_seconds.to_string(),
    ));
    variables
}

async fn replica(dir: &std::path::Path, nats: &Nats, max_lag_seconds: u64) -> Replica {
    replica_with(dir, nats, max_lag_seconds, &[]).await
}

/// A replica that publishes every write it takes to the log itself, before acknowledging it
/// (`replication.queue_writes = false`): a write's token is then its log position, which the
/// tests of the log's lag compare with the position a read was answered at.
async fn direct_replica(dir: &std::path::Path, nats: &Nats, max_lag_seconds: u64) -> Replica {
    let direct = [("LATHE_REPLICATION__QUEUE_WRITES", "false".to_string())];
    replica_with(dir, nats, max_lag_seconds, &direct).await
}

async fn replica_with(
    dir: &std::path::Path,
    nats: &Nats,
    max_lag_seconds: u64,
    more: &[(&'static str, String)],
) -> Replica {
    let mut variables = variables(nats, max_lag_seconds);
    variables.extend_from_slice(more);
    let server = binary::start(dir, &variables);
    let replica = Replica {
        client: binary::connect(&server.address).await,
        server,
    };
    replica.until_ready(Duration::from_secs(60)).await;
    replica
}

fn metric(replica: &Replica, name: &str) -> f64 {
    let body = binary::scrape_metrics(&replica.server.metrics_address);
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

/// Waits (up to `limit`) until `replica` reports `status`; how long that took.
async fn until_health(replica: &Replica, status: ServingStatus, limit: Duration) -> Duration {
    let started = Instant::now();
    while replica.health().await != status {
        assert!(started.elapsed() < limit, "not {status:?} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_stall_is_recovered_within_seconds_and_replicas_that_cannot_read_the_log_stop_vouching(
) {
    const MAX_LAG: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut a = replica(&dir.path().join("a"), &nats, MAX_LAG).await;
    let mut b = replica(&dir.path().join("b"), &nats, MAX_LAG).await;
    create(&mut a.client, "c").await;
    let token = write(&mut a.client, "c", documents(0..20, 30)).await;
    let ids: Vec<String> = (0..20).map(|doc| format!("doc{doc}")).collect();
    assert_eq!(present(&mut b.client, "c", &ids, token).await.len(), 20);

    assert_eq!(metric(&a, "lathe_serving"), 1.0);
    binary::signal(nats.pid(), "-STOP");
    // Neither can read the log: once they have not for max_lag_seconds, they stop vouching, and
    // their metrics say so (an alert needs no kube-state-metrics).
    for replica in [&a, &b] {
        until_health(
            replica,
            ServingStatus::NotServing,
            Duration::from_secs(MAX_LAG + 5),
        )
        .await;
        assert_eq!(metric(replica, "lathe_serving"), 0.0);
    }
    // Reads are still answered, from what each holds.
    assert_eq!(present(&mut b.client, "c", &ids, 0).await.len(), 20);
    tokio::time::sleep(Duration::from_secs(30 - MAX_LAG - 5)).await;
    binary::signal(nats.pid(), "-CONT");
    let resumed = Instant::now();

    // A write with wait=true, and its token read on the other replica: both within 5 s.
    let reply = a
        .client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: "c".into(),
            documents: documents(20..21, 30),
            wait: true,
            write_id: String::new(),
        })
        .await
        .expect("a write once nats-server is back")
        .into_inner();
    let mut read = tonic::Request::new({
        let mut request = common::retrieve_request("c", "document", 512);
        request.consistency_token = reply.consistency_token;
        request.filter = Some(proto::Filter {
            metadata: Vec::new(),
            doc_ids: vec!["doc20".into()],
        });
        request
    });
    read.set_timeout(Duration::from_secs(10));
    let answer = b.client.retrieve(read).await.expect("read at the token");
    assert_eq!(answer.into_inner().chunks[0].doc_id, "doc20");
    let applied_everywhere = resumed.elapsed();
    println!("after SIGCONT: the write applied on both replicas in {applied_everywhere:?}");
    assert!(
        applied_everywhere <= Duration::from_secs(5),
        "the write took {applied_everywhere:?} after nats-server resumed to be applied on both"
    );
    for replica in [&a, &b] {
        until_health(replica, ServingStatus::Serving, Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_paused_during_2000_writes_never_serves_older_than_its_max_lag() {
    const MAX_LAG: u64 = 60;
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut writer = direct_replica(&dir.path().join("writer"), &nats, MAX_LAG).await;
    let mut paused = direct_replica(&dir.path().join("paused"), &nats, MAX_LAG).await;
    create(&mut writer.client, "c").await;
    write(&mut writer.client, "c", documents(0..1, 20)).await;
    let pid = paused.server.child.id();
    binary::signal(pid, "-STOP");
    let stopped = Instant::now();
    // 2,000 writes over the pause, each remembered with when its acknowledgement came.
    let mut written: Vec<(Instant, u64)> = Vec::new();
    for doc in 0..2_000usize {
        let token = write(&mut writer.client, "c", documents(doc..doc + 1, 12)).await;
        written.push((Instant::now(), token));
        let due = stopped + Duration::from_millis(30 * doc as u64);
        tokio::time::sleep(due.saturating_duration_since(Instant::now())).await;
    }
    tokio::time::sleep(Duration::from_secs(70).saturating_sub(stopped.elapsed())).await;
    binary::signal(pid, "-CONT");
    let resumed = Instant::now();
    let head = written.last().unwrap().1;

    // Every read answered while SERVING (health before and after it) holds every write
    // acknowledged more than MAX_LAG before it.
    let ids = vec!["doc0".to_string()];
    let mut served_reads = 0;
    loop {
        let before = paused.health().await;
        let asked = Instant::now();
        let mut request = common::retrieve_request("c", "document", 256);
        request.filter = Some(proto::Filter {
            metadata: Vec::new(),
            doc_ids: ids.clone(),
        });
        let position = paused
            .client
            .retrieve(request)
            .await
            .expect("reads are answered")
            .into_inner()
            .log_position;
        let after = paused.health().await;
        if before == ServingStatus::Serving && after == ServingStatus::Serving {
            served_reads += 1;
            let due = written
                .iter()
                .take_while(|(at, _)| asked.duration_since(*at) > Duration::from_secs(MAX_LAG))
                .last()
                .map_or(0, |(_, token)| *token);
            assert!(
                position >= due,
                "answered while SERVING at position {position}, missing writes acknowledged over {MAX_LAG} s before (up to {due}), {:?} after SIGCONT",
                resumed.elapsed()
            );
            if position >= head {
                break;
            }
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(120),
            "not caught up with {head} two minutes after SIGCONT (at {position})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served_reads > 0);
    println!(
        "caught up with {head} entries {:?} after SIGCONT; {served_reads} reads answered while SERVING on the way",
        resumed.elapsed()
    );
    // Caught up: every write is there.
    let all: Vec<String> = (0..2_000).map(|doc| format!("doc{doc}")).collect();
    for chunk in all.chunks(100) {
        assert_eq!(
            present(&mut paused.client, "c", chunk, head).await.len(),
            100
        );
    }
}

/// Waits until `replica` has noticed its log is lost: NOT_SERVING, one ERROR naming `cause`,
/// the metric at 1, writes refused; within `limit` of `since`.
async fn assert_lost(replica: &mut Replica, cause: &str, since: Instant, limit: Duration) {
    let line = binary::wait_for_line(&replica.server.log, "is lost", limit);
    println!("`{cause}` noticed {:?} after it happened", since.elapsed());
    assert!(line.contains("ERROR") && line.contains(cause), "{line}");
    assert!(
        since.elapsed() <= limit,
        "noticed {:?} after the log was lost",
        since.elapsed()
    );
    assert_eq!(replica.health().await, ServingStatus::NotServing);
    assert_eq!(metric(replica, "lathe_replication_log_lost"), 1.0);
    assert_write_refused(&mut replica.client, cause).await;
    // What it holds is still served.
    assert_eq!(
        present(&mut replica.client, "c", &["doc0".into()], 0)
            .await
            .len(),
        1
    );
}

async fn two_replicas_with_documents(dir: &std::path::Path, nats: &Nats) -> (Replica, Replica) {
    let mut a = replica(&dir.join("a"), nats, 60).await;
    let mut b = replica(&dir.join("b"), nats, 60).await;
    create(&mut a.client, "c").await;
    let token = write(&mut a.client, "c", documents(0..10, 20)).await;
    let ids: Vec<String> = (0..10).map(|doc| format!("doc{doc}")).collect();
    assert_eq!(present(&mut b.client, "c", &ids, token).await.len(), 10);
    // What they logged while starting is not what is looked for.
    while a.server.log.try_recv().is_ok() {}
    while b.server.log.try_recv().is_ok() {}
    (a, b)
}

async fn jetstream(nats: &Nats) -> async_nats::jetstream::Context {
    let client = async_nats::connect(nats.url())
        .await
        .expect("connect to nats");
    async_nats::jetstream::new(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_log_is_noticed_by_every_replica_and_no_write_is_taken_after() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let (mut a, mut b) = two_replicas_with_documents(dir.path(), &nats).await;
    let mut stream = jetstream(&nats).await.get_stream("LATHE").await.unwrap();
    stream.purge().await.expect("purge the stream");
    let purged = Instant::now();
    for replica in [&mut a, &mut b] {
        assert_lost(replica, "was purged", purged, Duration::from_secs(10)).await;
    }
    // Nothing was published after the purge was noticed: the log holds no entry.
    let info = stream.info().await.unwrap();
    assert_eq!(info.state.messages, 0, "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_log_and_a_nats_server_on_an_empty_store_are_noticed_and_never_remade() {
    let dir = tempfile::tempdir().unwrap();
    let mut nats = Nats::start(dir.path(), None);
    let (mut a, mut b) = two_replicas_with_documents(dir.path(), &nats).await;
    jetstream(&nats)
        .await
        .delete_stream("LATHE")
        .await
        .expect("delete the stream");
    let deleted = Instant::now();
    for replica in [&mut a, &mut b] {
        assert_lost(
            replica,
            "no longer exists",
            deleted,
            Duration::from_secs(10),
        )
        .await;
    }
    // No replica made the stream again.
    assert!(jetstream(&nats).await.get_stream("LATHE").await.is_err());
    drop((a, b));

    // nats-server restarted on an empty store, under running replicas.
    let dir = tempfile::tempdir().unwrap();
    nats.kill();
    nats.wipe_store();
    nats.restart();
    let (mut a, mut b) = two_replicas_with_documents(dir.path(), &nats).await;
    nats.kill();
    nats.wipe_store();
    nats.restart();
    let restarted = Instant::now();
    for replica in [&mut a, &mut b] {
        assert_lost(
            replica,
            "no longer exists",
            restarted,
            Duration::from_secs(15),
        )
        .await;
    }
    assert!(jetstream(&nats).await.get_stream("LATHE").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_overlapping_the_logs_subjects_stops_the_start_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    jetstream(&nats)
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: "lathe".into(),
            subjects: vec!["lathe.log.>".into()],
            ..Default::default()
        })
        .await
        .expect("another stream");
    let mut spawned = binary::spawn(&dir.path().join("a"), &variables(&nats, 60));
    let status = binary::wait_for_exit(&mut spawned.child, Duration::from_secs(60));
    assert!(!status.success());
    let log: Vec<String> = spawned.log.try_iter().collect();
    let line = log
        .iter()
        .find(|line| line.contains("replication.stream"))
        .unwrap_or_else(|| panic!("{log:#?}"));
    assert!(line.contains("overlap"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_of_a_three_node_nats_cluster_killed_during_writes_loses_no_acknowledged_write()
{
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = NatsCluster::start(dir.path(), 3);
    // The cluster elects its JetStream meta leader before a stream can be made.
    let servers: Vec<async_nats::ServerAddr> = cluster
        .url()
        .split(',')
        .map(|url| url.parse().unwrap())
        .collect();
    let nats = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(servers)
        .await
        .expect("connect");
    let js = async_nats::jetstream::new(nats);
    let started = Instant::now();
    // A stream that is not there answers "not found" once the meta leader is elected.
    while let Err(error) = js.get_stream("NONE").await {
        if error.to_string().contains("not found") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no JetStream: {error}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut variables = replica_variables(&cluster.url());
    variables.push(("LATHE_REPLICATION__STREAM_REPLICAS", "3".into()));
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        let server = binary::start(&dir.path().join(name), &variables);
        let replica = Replica {
            client: binary::connect(&server.address).await,
            server,
        };
        replica.until_ready(Duration::from_secs(60)).await;
        replicas.push(replica);
    }
    create(&mut replicas[0].client, "c").await;

    let total = 120;
    let (mut killed_at, mut resumed_after, mut retries, mut token) = (None, None, 0, 0);
    for doc in 0..total {
        if doc == 40 {
            let mut stream = js.get_stream("LATHE").await.unwrap();
            let leader = stream
                .info()
                .await
                .unwrap()
                .cluster
                .clone()
                .and_then(|c| c.leader)
                .expect("the stream's leader");
            cluster.kill(&leader);
            killed_at = Some(Instant::now());
        }
        loop {
            let reply = replicas[0]
                .client
                .upsert_documents(proto::UpsertDocumentsRequest {
                    collection: "c".into(),
                    documents: documents(doc..doc + 1, 20),
                    wait: false,
                    write_id: format!("w{doc}"),
                })
                .await;
            match reply {
                Ok(reply) => {
                    token = token.max(reply.into_inner().consistency_token);
                    if let (Some(at), None) = (killed_at, resumed_after) {
                        resumed_after = Some(at.elapsed());
                    }
                    break;
                }
                // Not acknowledged: may or may not be stored; the same write_id applies it once.
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) =>
                {
                    retries += 1;
                    assert!(
                        killed_at.is_some_and(|at| at.elapsed() < Duration::from_secs(30)),
                        "writes have not resumed: {status:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("write {doc}: {status:?}"),
            }
        }
    }
    eprintln!(
        "the first write after the leader was killed was acknowledged after {resumed_after:?} \
         ({retries} refused in between)"
    );
    let ids: Vec<String> = (0..total).map(|doc| format!("doc{doc}")).collect();
    for replica in &mut replicas {
        let mut found = std::collections::BTreeSet::new();
        for part in ids.chunks(40) {
            found.extend(present(&mut replica.client, "c", part, token).await);
        }
        assert_eq!(found.len(), total, "{found:?}");
        let info = replica
            .client
            .get_collection(proto::GetCollectionRequest { name: "c".into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.stats.map(|s| s.documents), Some(total as u64));
    }
}

/// The first line of `replica`'s log holding `needle` among those written so far, if any.
fn logged_so_far(replica: &Replica, needle: &str) -> Option<String> {
    let mut found = None;
    while let Ok(line) = replica.server.log.try_recv() {
        if found.is_none() && line.contains(needle) {
            found = Some(line);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_disk_fills_stops_vouching_and_catches_up_by_itself_once_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path(), None);
    let mut a = direct_replica(&dir.path().join("a"), &nats, 60).await;
    let b_data = dir.path().join("b");
    let mut disk = Tmpfs::mount(&b_data.join("collections"), "6m");
    let mut b = direct_replica(&b_data, &nats, 60).await;
    disk.server_pid = Some(b.server.child.id());
    create(&mut a.client, "c").await;

    // Long documents onto A until B cannot store what it applies.
    let mut written = 0;
    let (failure, mut token) = loop {
        let token = write(&mut a.client, "c", documents(written..written + 10, 1500)).await;
        written += 10;
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Some(line) = logged_so_far(&b, "applying log entries failed") {
            break (line, token);
        }
        assert!(written < 1500, "the replica's disk never filled");
    };
    assert!(
        failure.contains("ERROR") && failure.contains("No space left"),
        "{failure}"
    );
    // It does not vouch for data it cannot bring up to date; the other replica goes on.
    let stopped_vouching =
        until_health(&b, ServingStatus::NotServing, Duration::from_secs(10)).await;
    assert_eq!(a.health().await, ServingStatus::Serving);
    token = token.max(write(&mut a.client, "c", documents(written..written + 5, 20)).await);
    written += 5;
    // A write with `wait` to the replica that cannot apply: stored in the log, not visible there
    // within its deadline, and the answer says so with the token to read it at.
    let mut request = tonic::Request::new(proto::UpsertDocumentsRequest {
        collection: "c".into(),
        documents: documents(written..written + 1, 20),
        wait: true,
        write_id: "on-the-full-disk".into(),
    });
    request.set_timeout(Duration::from_secs(3));
    let stored = b
        .client
        .upsert_documents(request)
        .await
        .expect_err("not visible on a replica that cannot apply");
    written += 1;
    assert_eq!(stored.code(), tonic::Code::DeadlineExceeded, "{stored:?}");
    assert!(
        stored.message().contains("is stored in the write log")
            && stored.message().contains("on-the-full-disk"),
        "{stored:?}"
    );
    let details = tonic_types::StatusExt::get_error_details(&stored);
    let info = details.error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "WRITE_STORED");
    let stored_at: u64 = info.metadata["consistency_token"].parse().unwrap();
    token = token.max(stored_at);

    // Room again: B applies what waited, by itself, and vouches again.
    disk.remount("size=512m");
    let resumed = until_health(&b, ServingStatus::Serving, Duration::from_secs(90)).await;
    eprintln!(
        "the disk filled after {written} documents; NOT_SERVING {stopped_vouching:?} after the \
         failure was seen, SERVING again {resumed:?} after the tmpfs grew"
    );
    let ids: Vec<String> = (0..written).map(|doc| format!("doc{doc}")).collect();
    for replica in [&mut a, &mut b] {
        let mut found = std::collections::BTreeSet::new();
        for part in ids.chunks(40) {
            found.extend(present(&mut replica.client, "c", part, token).await);
        }
        assert_eq!(found.len(), written, "{} of {written}", found.len());
    }
    drop(b);
}
