//! The measurements: the build through replica 0, read runs over 1..=N replicas, write latencies
//! (replicated and single-node), and the followers' lag under a sustained write load.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::processes::{Replica, Spawner};
use crate::report::Report;
use crate::{Args, COLLECTION};
use lathe_tools::client::{connect, upload_in_batches};
use lathe_tools::eval::{percentile, Dataset};
use lathe_tools::proto;

pub(crate) async fn create(client: &mut lathe_tools::client::Client) -> anyhow::Result<()> {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: COLLECTION.into(),
            settings: None,
        })
        .await?;
    Ok(())
}

pub(crate) fn corpus(dataset: &Dataset, copies: usize) -> Vec<proto::Document> {
    let originals = dataset.proto_documents(false);
    (0..copies.max(1))
        .flat_map(|copy| {
            originals.iter().cloned().map(move |mut document| {
                if copy > 0 {
                    document.id = format!("{}~copy{copy}", document.id);
                    document.text = format!("Copy {copy}. {}", document.text);
                }
                document
            })
        })
        .collect()
}

pub(crate) async fn build(
    args: &Args,
    dataset: &Dataset,
    writer: &mut Replica,
    report: &mut Report,
) -> anyhow::Result<()> {
    create(&mut writer.client).await?;
    let documents = corpus(dataset, args.copies);
    report.text_bytes = documents.iter().map(|d| d.text.len() as u64).sum();
    let started = Instant::now();
    upload_in_batches(&mut writer.client, COLLECTION, documents, 16).await?;
    report.build = started.elapsed();
    let stats = stats(&mut writer.client).await?;
    (report.documents, report.sections) = (stats.documents, stats.sections);
    Ok(())
}

/// The benchmark collection's statistics on the replica of `client`.
pub(crate) async fn stats(
    client: &mut lathe_tools::client::Client,
) -> anyhow::Result<proto::CollectionStats> {
    client
        .get_collection(proto::GetCollectionRequest {
            name: COLLECTION.into(),
        })
        .await?
        .into_inner()
        .stats
        .context("no stats")
}

#[derive(Default)]
pub(crate) struct LoadRun {
    requests: u64,
    pub(crate) errors: u64,
    pub(crate) seconds: f64,
    pub(crate) latencies_us: Vec<u64>,
}

/// One read run: `clients` clients asking the dataset's questions for `seconds`; `asked` counts
/// the requests of every run so far.
pub(crate) struct ReadLoad<'a> {
    pub(crate) dataset: &'a Dataset,
    pub(crate) clients: usize,
    pub(crate) seconds: u64,
    pub(crate) budget: u32,
    pub(crate) asked: Arc<AtomicU64>,
}

/// The clients of `load` over `addresses` (round-robin), every request a result-cache miss.
pub(crate) async fn read_load(addresses: &[String], load: ReadLoad<'_>) -> anyhow::Result<LoadRun> {
    let questions: Arc<Vec<String>> = Arc::new(
        load.dataset
            .queries
            .iter()
            .map(|q| q.question.clone())
            .collect(),
    );
    anyhow::ensure!(!questions.is_empty(), "the dataset has no queries");
    let (next, budget, clients) = (load.asked, load.budget, load.clients);
    let deadline = Instant::now() + Duration::from_secs(load.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..clients {
        let mut client = connect(&addresses[i % addresses.len()]).await?;
        let (questions, next) = (Arc::clone(&questions), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut run = LoadRun::default();
            while Instant::now() < deadline {
                let n = next.fetch_add(1, Ordering::Relaxed) as usize;
                let request = proto::RetrieveRequest {
                    collection: COLLECTION.into(),
                    query: questions[n % questions.len()].clone(),
                    // Each pass over the questions asks at another budget: never a cached answer.
                    token_budget: budget + (n / questions.len()) as u32,
                    ..Default::default()
                };
                let sent = Instant::now();
                match client.retrieve(request).await {
                    Ok(_) => run.latencies_us.push(sent.elapsed().as_micros() as u64),
                    Err(_) => run.errors += 1,
                }
                run.requests += 1;
            }
            run
        }));
    }
    let mut total = LoadRun::default();
    for task in tasks {
        let run = task.await?;
        total.requests += run.requests;
        total.errors += run.errors;
        total.latencies_us.extend(run.latencies_us);
    }
    total.seconds = started.elapsed().as_secs_f64();
    total.latencies_us.sort_unstable();
    Ok(total)
}

fn one_document(n: usize) -> proto::Document {
    proto::Document {
        id: format!("write-{n}"),
        title: format!("write {n}"),
        text: format!(
            "Write {n} of the latency run. The spindle turns at {} revolutions a minute while the carriage feeds the tool along the bed, and the coolant keeps the cut cool.",
            100 + n
        ),
        format: proto::DocumentFormat::Plain as i32,
        ..Default::default()
    }
}

/// `count` single-document upserts; p50 and p99 in ms.
async fn upsert_latencies(
    client: &mut lathe_tools::client::Client,
    first: usize,
    count: usize,
    wait: bool,
) -> anyhow::Result<(f64, f64)> {
    let mut latencies = Vec::with_capacity(count);
    for n in first..first + count {
        let sent = Instant::now();
        client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: COLLECTION.into(),
                documents: vec![one_document(n)],
                wait,
                write_id: String::new(),
            })
            .await?;
        latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    Ok((percentile(&latencies, 50.0), percentile(&latencies, 99.0)))
}

pub(crate) async fn write_latencies(
    args: &Args,
    spawner: &Spawner,
    work: &Path,
    replica: &mut Replica,
    report: &mut Report,
) -> anyhow::Result<()> {
    let count = args.writes;
    let (p50, p99) = upsert_latencies(&mut replica.client, 0, count, false).await?;
    report
        .writes
        .push(("replicated, acknowledged by JetStream (no wait)", p50, p99));
    let (p50, p99) = upsert_latencies(&mut replica.client, count, count, true).await?;
    report.writes.push((
        "replicated, wait (visible on the replica that took it)",
        p50,
        p99,
    ));
    let mut single = spawner.replica(&work.join("single"), None).await?;
    create(&mut single.client).await?;
    let (p50, p99) = upsert_latencies(&mut single.client, 0, count, true).await?;
    report.writes.push((
        "single node, wait (committed, today's durable write)",
        p50,
        p99,
    ));
    let (p50, p99) = upsert_latencies(&mut single.client, count, count, false).await?;
    report.writes.push((
        "single node, no wait (queued; lost on a crash within commit_interval_ms)",
        p50,
        p99,
    ));
    Ok(())
}

#[derive(Default)]
pub(crate) struct LagRun {
    pub(crate) writes: u64,
    pub(crate) documents: u64,
    pub(crate) seconds: f64,
    /// Sampled lag seconds and distances (entries) of the followers.
    pub(crate) lags: Vec<f64>,
    pub(crate) distances: Vec<u64>,
    pub(crate) catch_up: Duration,
}

/// A writer without `wait` on replica 0 for `args.seconds`, the followers sampled meanwhile.
pub(crate) async fn write_load(args: &Args, replicas: &[Replica]) -> anyhow::Result<LagRun> {
    let head = Arc::new(AtomicU64::new(0));
    let writing = Arc::new(AtomicBool::new(true));
    let mut writer_client = replicas[0].client.clone();
    let writer = {
        let (head, writing) = (Arc::clone(&head), Arc::clone(&writing));
        tokio::spawn(async move {
            let (mut writes, mut n) = (0u64, 1_000_000usize);
            while writing.load(Ordering::Relaxed) {
                let documents: Vec<_> = (n..n + 8).map(one_document).collect();
                n += 8;
                let reply = writer_client
                    .upsert_documents(proto::UpsertDocumentsRequest {
                        collection: COLLECTION.into(),
                        documents,
                        wait: false,
                        write_id: String::new(),
                    })
                    .await?
                    .into_inner();
                head.fetch_max(reply.consistency_token, Ordering::Relaxed);
                writes += 1;
            }
            anyhow::Ok(writes)
        })
    };
    let mut run = LagRun::default();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(args.seconds) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for follower in &replicas[1..] {
            run.lags
                .push(follower.metric("lathe_replication_lag_seconds")?);
            let applied = follower.metric("lathe_replication_applied_position")? as u64;
            run.distances
                .push(head.load(Ordering::Relaxed).saturating_sub(applied));
        }
    }
    writing.store(false, Ordering::Relaxed);
    run.writes = writer.await??;
    run.documents = run.writes * 8;
    run.seconds = started.elapsed().as_secs_f64();
    let last = head.load(Ordering::Relaxed);
    let stopped = Instant::now();
    for follower in &replicas[1..] {
        while (follower.metric("lathe_replication_applied_position")? as u64) < last {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    run.catch_up = stopped.elapsed();
    run.lags.sort_by(f64::total_cmp);
    run.distances.sort_unstable();
    Ok(run)
}
