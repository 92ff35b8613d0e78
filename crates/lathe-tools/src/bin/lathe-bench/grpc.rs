//! The bench's gRPC steps: building a collection from the corpus, the write before `kill -9`,
//! the first Retrieve of an open (its open time) and the latency runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::report::{Latency, StageLatency};
use lathe_tools::client::{connect, upload_in_batches};
use lathe_tools::eval::percentile;
use lathe_tools::proto;
use lathe_tools::scale_corpus::{corpus_document, SourceDocument};

/// The queries of one size, handed out once each so that no Retrieve hits the result cache.
pub(crate) struct QueryFeed {
    pub(crate) queries: Vec<String>,
    pub(crate) next: AtomicUsize,
}

impl QueryFeed {
    pub(crate) fn take(&self) -> anyhow::Result<String> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.queries
            .get(i)
            .cloned()
            .context("ran out of distinct queries: the corpus has too few query lines")
    }
}

fn retrieve_request(collection: &str, query: String, budget: u32) -> proto::RetrieveRequest {
    proto::RetrieveRequest {
        collection: collection.to_string(),
        query,
        token_budget: budget,
        ..Default::default()
    }
}

/// Connects and retries the first Retrieve until it succeeds (a collection may still be opening
/// after the listener is up); the time from spawn to that answer is the open time.
pub(crate) async fn first_retrieve(
    address: &str,
    collection: &str,
    feed: &QueryFeed,
    budget: u32,
    spawned_at: Instant,
) -> anyhow::Result<(lathe_tools::client::Client, f64)> {
    let mut client = connect(address).await?;
    let query = feed.take()?;
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        match client
            .retrieve(retrieve_request(collection, query.clone(), budget))
            .await
        {
            Ok(_) => return Ok((client, spawned_at.elapsed().as_secs_f64())),
            Err(status) if Instant::now() > deadline => {
                anyhow::bail!("the first Retrieve never succeeded: {status}")
            }
            Err(status) if status.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(status) => anyhow::bail!("the first Retrieve failed: {status}"),
        }
    }
}

/// `count` Retrieves from `clients` connections, each query new: the latency summary and the
/// server's stage timings.
pub(crate) async fn measure_latency(
    address: &str,
    collection: &str,
    feed: Arc<QueryFeed>,
    count: usize,
    clients: usize,
    budget: u32,
) -> anyhow::Result<(Latency, Vec<StageLatency>)> {
    let issued = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut client = connect(address).await?;
        let (feed, issued, collection) = (
            Arc::clone(&feed),
            Arc::clone(&issued),
            collection.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut timings = Vec::new();
            while issued.fetch_add(1, Ordering::Relaxed) < count {
                let request = retrieve_request(&collection, feed.take()?, budget);
                let sent = Instant::now();
                let response = client
                    .retrieve(request)
                    .await
                    .map_err(|status| anyhow::anyhow!("Retrieve failed: {status}"))?;
                latencies.push(sent.elapsed().as_micros() as u64);
                timings.push(response.into_inner().timings);
            }
            anyhow::Ok((latencies, timings))
        }));
    }
    let mut latencies = Vec::with_capacity(count);
    let mut timings = Vec::with_capacity(count);
    for task in tasks {
        let (task_latencies, task_timings) = task.await.context("client task panicked")??;
        latencies.extend(task_latencies);
        timings.extend(task_timings);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok((latency_summary(latencies, seconds), stage_summary(&timings)))
}

/// p50 and p99 of each stage over `responses`, stages in the order first seen; a response that
/// skipped a stage counts 0 for it.
fn stage_summary(responses: &[Vec<proto::StageTiming>]) -> Vec<StageLatency> {
    let mut stages: Vec<String> = Vec::new();
    for timing in responses.iter().flatten() {
        if !stages.contains(&timing.stage) {
            stages.push(timing.stage.clone());
        }
    }
    stages
        .into_iter()
        .map(|stage| {
            let mut micros: Vec<u64> = responses
                .iter()
                .map(|timings| {
                    timings
                        .iter()
                        .filter(|timing| timing.stage == stage)
                        .map(|timing| timing.micros)
                        .sum()
                })
                .collect();
            micros.sort_unstable();
            StageLatency {
                stage,
                p50_ms: percentile(&micros, 50.0) as f64 / 1e3,
                p99_ms: percentile(&micros, 99.0) as f64 / 1e3,
            }
        })
        .collect()
}

fn latency_summary(mut latencies_us: Vec<u64>, seconds: f64) -> Latency {
    latencies_us.sort_unstable();
    Latency {
        p50_ms: percentile(&latencies_us, 50.0) as f64 / 1e3,
        p99_ms: percentile(&latencies_us, 99.0) as f64 / 1e3,
        qps: latencies_us.len() as f64 / seconds.max(f64::EPSILON),
    }
}

/// What a build wrote.
#[derive(Default)]
pub(crate) struct Built {
    pub(crate) documents: u64,
    pub(crate) sections: u64,
    pub(crate) text_bytes: u64,
    pub(crate) seconds: f64,
}

/// Creates `collection` and uploads copies of the corpus until it holds `target` sections.
pub(crate) async fn build_collection(
    client: &mut lathe_tools::client::Client,
    collection: &str,
    corpus: &[SourceDocument],
    target: usize,
    upload_documents: usize,
    section_tokens: Option<u32>,
) -> anyhow::Result<Built> {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: collection.to_string(),
            settings: section_tokens.map(|tokens| proto::CollectionSettings {
                section_tokens: Some(tokens),
                ..Default::default()
            }),
        })
        .await
        .map_err(|status| anyhow::anyhow!("creating the collection: {status}"))?;
    let mut built = Built::default();
    let started = Instant::now();
    let mut next = 0u64;
    while (built.sections as usize) < target {
        let take = documents_to_send(target, &built, upload_documents);
        let batch: Vec<proto::Document> = (next..next + take as u64)
            .map(|i| corpus_document(corpus, i))
            .collect();
        next += take as u64;
        built.text_bytes += batch.iter().map(|d| d.text.len() as u64).sum::<u64>();
        let written = upload_in_batches(client, collection, batch, 16)
            .await
            .map_err(|status| anyhow::anyhow!("uploading: {status}"))?;
        built.documents += u64::from(written.documents);
        built.sections += u64::from(written.sections);
        eprint!(
            "\r  built {} of {target} sections ({:.1} MB, {:.1} s)   ",
            built.sections,
            built.text_bytes as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!();
    built.seconds = started.elapsed().as_secs_f64();
    Ok(built)
}

/// Documents for the next upload: about what the sections still missing need at the average
/// sections per document so far (the first upload: a tenth of the allowance), at least one.
fn documents_to_send(target: usize, built: &Built, upload_documents: usize) -> usize {
    let missing = target.saturating_sub(built.sections as usize);
    let estimate = if built.documents == 0 {
        upload_documents / 10
    } else {
        let per_document = built.sections as f64 / built.documents as f64;
        (missing as f64 / per_document.max(0.1)).ceil() as usize
    };
    estimate.clamp(1, upload_documents.max(1))
}

/// One acknowledged write, so the data a `kill -9` interrupts ends in a fresh commit.
pub(crate) async fn write_one_more(
    client: &mut lathe_tools::client::Client,
    collection: &str,
    corpus: &[SourceDocument],
) -> anyhow::Result<()> {
    let mut document = corpus_document(corpus, 0);
    document.id = "after-the-build".to_string();
    client
        .upsert_documents(proto::UpsertDocumentsRequest {
            collection: collection.to_string(),
            documents: vec![document],
            wait: true,
            write_id: String::new(),
        })
        .await
        .map_err(|status| anyhow::anyhow!("the write before kill -9: {status}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_sends_what_the_missing_sections_need_within_the_allowance() {
        let mut built = Built::default();
        assert_eq!(documents_to_send(10_000, &built, 256), 25);
        built.documents = 25;
        built.sections = 100;
        // 4 sections a document, 9,900 missing: capped at the allowance.
        assert_eq!(documents_to_send(10_000, &built, 256), 256);
        built.documents = 2_500;
        built.sections = 9_990;
        assert_eq!(documents_to_send(10_000, &built, 256), 3);
    }

    #[test]
    fn latency_percentiles_summarise() {
        let latency = latency_summary((1..=100).rev().map(|ms| ms * 1000).collect(), 2.0);
        assert_eq!(latency.p50_ms, 50.0);
        assert_eq!(latency.p99_ms, 99.0);
        assert_eq!(latency.qps, 50.0);
    }

    #[test]
    fn stage_timings_summarise_per_stage_and_count_a_skipped_stage_as_zero() {
        let timing = |stage: &str, micros| proto::StageTiming {
            stage: stage.into(),
            micros,
        };
        let responses = vec![
            vec![timing("coarse", 1000), timing("total", 3000)],
            vec![
                timing("coarse", 3000),
                timing("pack", 500),
                timing("total", 5000),
            ],
        ];
        let stages = stage_summary(&responses);
        let names: Vec<&str> = stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(names, ["coarse", "total", "pack"]);
        assert_eq!(stages[2].p50_ms, 0.0);
        assert_eq!(stages[2].p99_ms, 0.5);
    }
}
