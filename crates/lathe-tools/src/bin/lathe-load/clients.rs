//! What the load's clients do: the requests of each mode (`miss`, `hit`, the warm-up), a client's
//! loop and what it counts, the writer beside them, and the questions they ask.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use lathe_text::normalise_query;
use lathe_tools::eval::Dataset;
use lathe_tools::proto;

use crate::run::{Interval, LoadTarget};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Miss,
    Hit,
    /// Untimed `miss` requests that walk the questions from the last one back, so the `miss`
    /// runs after it (which walk from the first) meet none of its questions.
    WarmUp,
}

#[derive(Default)]
pub(crate) struct ClientStats {
    pub(crate) latencies_us: Vec<u32>,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) cache_hits: u64,
    /// The server's timing of each stage, in microseconds, one entry per answer that had it.
    pub(crate) stages_us: BTreeMap<String, Vec<u32>>,
}

/// What one client asks, and until when; cloned for each client of a run.
#[derive(Clone)]
pub(crate) struct ClientWork {
    pub(crate) mode: Mode,
    pub(crate) collection: Arc<str>,
    pub(crate) questions: Arc<Vec<String>>,
    /// The questions `hit` mode repeats (indices into `questions`).
    pub(crate) hot: Arc<Vec<usize>>,
    pub(crate) counter: Arc<AtomicU64>,
    /// The counter's value when the run started: `max_requests` counts from here.
    pub(crate) first_request: u64,
    pub(crate) max_requests: u64,
    pub(crate) budget: u32,
    pub(crate) top_k: u32,
    pub(crate) order: proto::ResultOrder,
    pub(crate) interval: Option<Arc<Interval>>,
    pub(crate) deadline: Instant,
    /// With `--rate`: the time between one client's requests.
    pub(crate) pace: Option<Duration>,
}

impl ClientWork {
    /// The question and budget of request `i`: in `miss` mode each pass over the questions
    /// raises the budget by one token, so no (question, budget) pair repeats.
    fn request(&self, i: u64) -> proto::RetrieveRequest {
        let (question, budget) = match self.mode {
            Mode::Miss => {
                let pass = i / self.questions.len() as u64;
                (
                    self.questions[(i % self.questions.len() as u64) as usize].clone(),
                    self.budget.saturating_add(pass as u32),
                )
            }
            Mode::Hit => (
                self.questions[self.hot[(i % self.hot.len() as u64) as usize]].clone(),
                self.budget,
            ),
            Mode::WarmUp => {
                let count = self.questions.len() as u64;
                let from_the_end = count - 1 - i % count;
                (
                    self.questions[from_the_end as usize].clone(),
                    self.budget.saturating_add((i / count) as u32),
                )
            }
        };
        proto::RetrieveRequest {
            collection: self.collection.to_string(),
            query: question,
            top_k: requested_top_k(self.top_k),
            token_budget: budget,
            order: self.order as i32,
            ..Default::default()
        }
    }
}

pub(crate) async fn run_client(
    mut client: lathe_tools::client::Client,
    work: ClientWork,
) -> ClientStats {
    let mut stats = ClientStats::default();
    // Open loop: requests are due on a schedule, and one answered late leaves the later ones
    // due when they were (a burst catches up), so a slow answer cannot hide the wait it causes.
    let mut schedule = work.pace.map(|pace| {
        let mut schedule = tokio::time::interval(pace);
        schedule.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        schedule
    });
    while Instant::now() < work.deadline {
        let due = match &mut schedule {
            Some(schedule) => Some(schedule.tick().await.into_std()),
            None => None,
        };
        if Instant::now() >= work.deadline {
            break;
        }
        let i = work.counter.fetch_add(1, Ordering::Relaxed);
        if i - work.first_request >= work.max_requests {
            break;
        }
        let request = work.request(i);
        let sent = due.unwrap_or_else(Instant::now);
        let result = client.retrieve(request).await;
        let micros = sent.elapsed().as_micros().min(u32::MAX as u128) as u32;
        match result {
            Ok(response) => {
                stats.latencies_us.push(micros);
                if let Some(interval) = &work.interval {
                    interval
                        .latencies_us
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(micros);
                }
                let response = response.into_inner();
                if response.cache_hit {
                    stats.cache_hits += 1;
                }
                for timing in response.timings {
                    let micros = timing.micros.min(u32::MAX as u64) as u32;
                    stats
                        .stages_us
                        .entry(timing.stage)
                        .or_default()
                        .push(micros);
                }
            }
            Err(status) => {
                *stats
                    .errors
                    .entry(format!("{:?}", status.code()))
                    .or_default() += 1;
            }
        }
    }
    stats
}

/// The writer's next request: an upsert of a new revision of one of 16 extra documents, or, one
/// write in four, the deletion of one of them.
fn writer_request(
    collection: &str,
    dataset: &Dataset,
    revision: u64,
) -> Result<proto::UpsertDocumentsRequest, proto::DeleteDocumentsRequest> {
    if revision % 4 == 3 {
        // Delete the document the next upsert will not touch for a while.
        return Err(proto::DeleteDocumentsRequest {
            collection: collection.to_string(),
            ids: vec![format!("writer-{}", (revision + 8) % 16)],
            wait: true,
            write_id: String::new(),
        });
    }
    let source = &dataset.documents[(revision as usize) % dataset.documents.len()];
    // A new revision of one of 16 extra documents: real text, so the index really changes.
    let document = proto::Document {
        id: format!("writer-{}", revision % 16),
        title: source.title.clone(),
        text: format!("{}\n\nRevision {revision}.", source.text),
        format: proto::DocumentFormat::Plain as i32,
        ..Default::default()
    };
    Ok(proto::UpsertDocumentsRequest {
        collection: collection.to_string(),
        documents: vec![document],
        wait: true,
        write_id: String::new(),
    })
}

pub(crate) async fn run_writer(
    mut client: lathe_tools::client::Client,
    collection: Arc<str>,
    dataset: Arc<Dataset>,
    interval: Option<Arc<Interval>>,
    deadline: Instant,
) -> (u64, u64) {
    let (mut writes, mut errors) = (0u64, 0u64);
    let mut revision = 0u64;
    while Instant::now() < deadline {
        let succeeded = match writer_request(&collection, &dataset, revision) {
            Ok(upsert) => client.upsert_documents(upsert).await.is_ok(),
            Err(delete) => client.delete_documents(delete).await.is_ok(),
        };
        revision += 1;
        if succeeded {
            writes += 1;
        } else {
            errors += 1;
        }
        if let Some(interval) = &interval {
            interval.writes.fetch_add(1, Ordering::Relaxed);
        }
    }
    (writes, errors)
}

/// The dataset's questions without repeats (normalised as the server normalises them), so a
/// `miss` run never asks the same thing twice.
pub(crate) fn distinct_questions(dataset: &Dataset) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    dataset
        .queries
        .iter()
        .map(|q| normalise_query(&q.question))
        .filter(|q| !q.is_empty() && seen.insert(q.clone()))
        .collect()
}

/// `hot_set` questions evenly spread over all of them: deterministic.
pub(crate) fn hot_questions(hot_set: usize, question_count: usize) -> Vec<usize> {
    let hot_len = hot_set.clamp(1, question_count);
    (0..hot_len).map(|i| i * question_count / hot_len).collect()
}

/// Asks every hot question once, so the timed `hit` run measures cache hits.
pub(crate) async fn warm_result_cache(
    client: &mut lathe_tools::client::Client,
    target: &LoadTarget,
    hot: &[usize],
) -> anyhow::Result<()> {
    for &q in hot {
        client
            .retrieve(proto::RetrieveRequest {
                collection: target.collection.to_string(),
                query: target.questions[q].clone(),
                top_k: requested_top_k(target.args.top_k),
                token_budget: target.args.budget,
                ..Default::default()
            })
            .await
            .context("warming the cache")?;
    }
    Ok(())
}

/// The request's `top_k`: none for 0, so the server chooses the depth from the budget.
pub(crate) fn requested_top_k(top_k: u32) -> Option<u32> {
    (top_k > 0).then_some(top_k)
}
