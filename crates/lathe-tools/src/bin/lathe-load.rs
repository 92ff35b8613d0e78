//! `lathe-load`: a load generator of real tonic clients against a Lathe server over loopback.
//!
//! It ingests a dataset's documents (docs.jsonl, e.g. shared/eval/squad-a) into a fresh collection
//! and asks the dataset's questions (queries.jsonl) from N concurrent clients, each on its own
//! HTTP/2 connection, for a fixed time; it reports QPS, latency percentiles, errors by gRPC code and
//! the share of answers served from the result cache. Modes:
//! - `miss`: every request is new to the result cache: clients walk through the distinct
//!   questions, and each new pass over them raises the budget by one token, so no (question,
//!   budget) pair repeats. The per-section analysis cache is content-addressed and still warms
//!   up, as it would in production; only whole answers are never reused.
//! - `hit`: a small set of questions at one budget, asked once before timing starts, then repeated.
//! - `--writer`: during each run, one more client writes continuously with `wait`: it upserts new
//!   revisions of 16 extra documents and deletes one in every four writes, so every write commits,
//!   moves the generation (which invalidates cached answers), leaves tombstones in the dense index
//!   (compacted once a quarter of it is dead) and new tantivy segments (merged in the background).
//! - `--read-only-first S`: with `--writer`, a read-only run of S seconds before each writer run,
//!   on the same collection and server: the baseline of a soak.
//! - `--sample-every S`: a soak report, one line every S seconds: requests, p99 and maximum latency
//!   of that interval, writes, and the resident memory of the server when this tool started it
//!   (else of this process, the clients).
//!
//! Without `--addr` it starts `lathe serve` (the binary beside this one) on a port-0 loopback
//! listener, sharing the machine's cores with the clients. Bounded by `--seconds` and `--max-requests`.
//!
//! `--warm-up-seconds S` first runs S seconds of untimed `miss` requests from the last question
//! back, so the timed runs meet a warm server but still only questions it has not seen. `--top-k 0` leaves the depth to the
//! server (as a caller who sets only the budget does); `--collection` reuses a collection already
//! on the server given with `--addr`; `--stages` adds the server's own per-stage timings (p50 and
//! p99) under each run's row.
//!
//! Example: `lathe-load ../shared/eval/squad-a --clients 1,8 --seconds 20 --mode miss,hit`

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tonic::transport::Channel;

use lathe_text::normalise_query;
use lathe_tools::client::{connect, unique_collection_name, upload_in_batches};
use lathe_tools::eval::{percentile, Dataset};
use lathe_tools::proto;
use lathe_tools::proto::lathe_client::LatheClient;
use lathe_tools::server_process::TargetServer;

#[derive(Parser, Debug)]
#[command(
    name = "lathe-load",
    about = "Load generator for a Lathe server (loopback gRPC)"
)]
struct Args {
    /// Folder with docs.jsonl and queries.jsonl.
    dataset: PathBuf,
    /// A running server (loopback only); without it one is started in this process.
    #[arg(long)]
    addr: Option<String>,
    #[arg(long, default_value = "./models")]
    models_dir: PathBuf,
    /// CPU pool threads of the server it starts (0: one per core).
    #[arg(long, default_value_t = 0)]
    cpu_threads: usize,
    /// Concurrent clients; several values (comma-separated) run one after another.
    #[arg(long, value_delimiter = ',', default_value = "8")]
    clients: Vec<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// miss, hit, or both (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "miss,hit")]
    mode: Vec<String>,
    /// Run a concurrent writer that upserts documents during each run.
    #[arg(long)]
    writer: bool,
    #[arg(long, default_value_t = 512)]
    budget: u32,
    /// Sections per request; 0 leaves `top_k` unset, so the server takes its depth from the budget.
    #[arg(long, default_value_t = 8)]
    top_k: u32,
    /// Result order of every request: score, or position (grouped by document, each chunk
    /// under its heading path).
    #[arg(long, default_value = "score", value_parser = ["score", "position"])]
    order: String,
    /// Query this existing collection of the server given with `--addr` instead of ingesting the
    /// dataset into a new one (its questions are still read from the dataset); it is kept.
    #[arg(long)]
    collection: Option<String>,
    /// First run `miss` requests from one client for this many seconds, untimed, from the last
    /// question back: the server and its section cache warm up, and the timed runs (from the
    /// first question on) still ask questions it has not seen, so neither their answers nor their
    /// query vectors are cached.
    #[arg(long, default_value_t = 0)]
    warm_up_seconds: u64,
    /// Also print the server's per-stage timings (RetrieveResponse.timings): p50 and p99 of each
    /// stage over the run's answers.
    #[arg(long)]
    stages: bool,
    /// Questions repeated in `hit` mode.
    #[arg(long, default_value_t = 32)]
    hot_set: usize,
    /// Upper bound on requests per run.
    #[arg(long, default_value_t = 2_000_000)]
    max_requests: u64,
    /// Print an interval line (latency, writes, RSS) every this many seconds; 0: off.
    #[arg(long, default_value_t = 0)]
    sample_every: u64,
    /// With `--writer`: first a read-only run of this many seconds on the same collection, the
    /// baseline a soak's latency is compared with; 0: none.
    #[arg(long, default_value_t = 0)]
    read_only_first: u64,
}

/// Latencies and writes of the current sampling interval, shared by the clients and the sampler.
#[derive(Default)]
struct Interval {
    latencies_us: std::sync::Mutex<Vec<u32>>,
    writes: AtomicU64,
}

/// Resident set size of this process in MiB (Linux), or `None` where /proc is not there.
/// Resident memory of process `pid` (this one when `None`).
fn resident_mib(pid: Option<u32>) -> Option<f64> {
    let path = pid.map_or("/proc/self/status".to_string(), |pid| {
        format!("/proc/{pid}/status")
    });
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

async fn run_sampler(
    interval: Arc<Interval>,
    every: Duration,
    started: Instant,
    deadline: Instant,
    server_pid: Option<u32>,
) {
    println!("| t s | requests | p50 ms | p99 ms | max ms | writes | RSS MiB |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut next = started + every;
    while next <= deadline + Duration::from_millis(500) {
        tokio::time::sleep_until(next.into()).await;
        next += every;
        let mut latencies = std::mem::take(
            &mut *interval
                .latencies_us
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        latencies.sort_unstable();
        let ms = |p: f64| percentile(&latencies, p) as f64 / 1e3;
        println!(
            "| {:.0} | {} | {:.2} | {:.2} | {:.2} | {} | {} |",
            started.elapsed().as_secs_f64(),
            latencies.len(),
            ms(50.0),
            ms(99.0),
            latencies.last().map_or(0.0, |&us| us as f64 / 1e3),
            interval.writes.swap(0, Ordering::Relaxed),
            resident_mib(server_pid).map_or("?".to_string(), |mib| format!("{mib:.0}")),
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Miss,
    Hit,
    /// Untimed `miss` requests that walk the questions from the last one back, so the `miss`
    /// runs after it (which walk from the first) meet none of its questions.
    WarmUp,
}

#[derive(Default)]
struct ClientStats {
    latencies_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    cache_hits: u64,
    /// The server's timing of each stage, in microseconds, one entry per answer that had it.
    stages_us: BTreeMap<String, Vec<u32>>,
}

struct RunReport {
    mode: Mode,
    clients: usize,
    writer: bool,
    seconds: f64,
    requests: u64,
    ok: u64,
    latencies_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    cache_hits: u64,
    stages_us: BTreeMap<String, Vec<u32>>,
    writes: u64,
    write_errors: u64,
}

fn is_loopback(address: &str) -> bool {
    let host = address
        .trim_start_matches("http://")
        .rsplit_once(':')
        .map_or(address, |(host, _)| host);
    matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1")
}

/// What every run shares: the server, the collection, the dataset and its questions.
struct LoadTarget {
    address: String,
    /// The server's process when this tool started it (its memory is sampled).
    server_pid: Option<u32>,
    collection: Arc<str>,
    dataset: Arc<Dataset>,
    /// The dataset's distinct questions.
    questions: Arc<Vec<String>>,
    /// The next request of `miss` runs: one sequence across runs, so none repeats a request.
    miss_counter: Arc<AtomicU64>,
    args: Arc<Args>,
}

/// What one run (one row of the table) is.
#[derive(Clone, Copy)]
struct RunShape {
    mode: Mode,
    clients: usize,
    /// Whether a writer runs beside the clients.
    writer: bool,
    seconds: u64,
}

/// What one client asks, and until when; cloned for each client of a run.
#[derive(Clone)]
struct ClientWork {
    mode: Mode,
    collection: Arc<str>,
    questions: Arc<Vec<String>>,
    /// The questions `hit` mode repeats (indices into `questions`).
    hot: Arc<Vec<usize>>,
    counter: Arc<AtomicU64>,
    /// The counter's value when the run started: `max_requests` counts from here.
    first_request: u64,
    max_requests: u64,
    budget: u32,
    top_k: u32,
    order: proto::ResultOrder,
    interval: Option<Arc<Interval>>,
    deadline: Instant,
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

async fn run_client(mut client: LatheClient<Channel>, work: ClientWork) -> ClientStats {
    let mut stats = ClientStats::default();
    while Instant::now() < work.deadline {
        let i = work.counter.fetch_add(1, Ordering::Relaxed);
        if i - work.first_request >= work.max_requests {
            break;
        }
        let request = work.request(i);
        let sent = Instant::now();
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
    })
}

async fn run_writer(
    mut client: LatheClient<Channel>,
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
fn distinct_questions(dataset: &Dataset) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    dataset
        .queries
        .iter()
        .map(|q| normalise_query(&q.question))
        .filter(|q| !q.is_empty() && seen.insert(q.clone()))
        .collect()
}

/// `hot_set` questions evenly spread over all of them: deterministic.
fn hot_questions(hot_set: usize, question_count: usize) -> Vec<usize> {
    let hot_len = hot_set.clamp(1, question_count);
    (0..hot_len).map(|i| i * question_count / hot_len).collect()
}

/// Asks every hot question once, so the timed `hit` run measures cache hits.
async fn warm_result_cache(
    client: &mut LatheClient<Channel>,
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

async fn run(target: &LoadTarget, shape: RunShape) -> anyhow::Result<RunReport> {
    let args = &target.args;
    let hot = Arc::new(hot_questions(args.hot_set, target.questions.len()));
    let mut connections = Vec::with_capacity(shape.clients);
    for _ in 0..shape.clients {
        connections.push(connect(&target.address).await?);
    }
    if shape.mode == Mode::Hit {
        warm_result_cache(&mut connections[0].clone(), target, &hot).await?;
    }
    let counter = match shape.mode {
        Mode::Miss => Arc::clone(&target.miss_counter),
        Mode::Hit | Mode::WarmUp => Arc::new(AtomicU64::new(0)),
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(shape.seconds);
    let interval = (args.sample_every > 0).then(|| Arc::new(Interval::default()));
    let sampler = interval.as_ref().map(|interval| {
        tokio::spawn(run_sampler(
            Arc::clone(interval),
            Duration::from_secs(args.sample_every),
            started,
            deadline,
            target.server_pid,
        ))
    });
    let writer_task = if shape.writer {
        let client = connect(&target.address).await?;
        Some(tokio::spawn(run_writer(
            client,
            Arc::clone(&target.collection),
            Arc::clone(&target.dataset),
            interval.clone(),
            deadline,
        )))
    } else {
        None
    };
    let work = ClientWork {
        mode: shape.mode,
        collection: Arc::clone(&target.collection),
        questions: Arc::clone(&target.questions),
        hot,
        first_request: counter.load(Ordering::Relaxed),
        counter,
        max_requests: args.max_requests,
        budget: args.budget,
        top_k: args.top_k,
        order: if args.order == "position" {
            proto::ResultOrder::Position
        } else {
            proto::ResultOrder::Score
        },
        interval,
        deadline,
    };
    let tasks: Vec<_> = connections
        .into_iter()
        .map(|client| tokio::spawn(run_client(client, work.clone())))
        .collect();
    let mut report = RunReport::empty(shape);
    for task in tasks {
        report.add(task.await.context("client task panicked")?);
    }
    report.seconds = started.elapsed().as_secs_f64();
    if let Some(writer) = writer_task {
        let (writes, errors) = writer.await.context("writer task panicked")?;
        report.writes = writes;
        report.write_errors = errors;
    }
    if let Some(sampler) = sampler {
        sampler.await.context("sampler task panicked")?;
    }
    report.finish();
    Ok(report)
}

impl RunReport {
    fn empty(shape: RunShape) -> Self {
        Self {
            mode: shape.mode,
            clients: shape.clients,
            writer: shape.writer,
            seconds: 0.0,
            requests: 0,
            ok: 0,
            latencies_us: Vec::new(),
            errors: BTreeMap::new(),
            cache_hits: 0,
            stages_us: BTreeMap::new(),
            writes: 0,
            write_errors: 0,
        }
    }

    fn add(&mut self, stats: ClientStats) {
        self.latencies_us.extend(stats.latencies_us);
        self.cache_hits += stats.cache_hits;
        for (code, count) in stats.errors {
            *self.errors.entry(code).or_default() += count;
        }
        for (stage, micros) in stats.stages_us {
            self.stages_us.entry(stage).or_default().extend(micros);
        }
    }

    /// Counts the requests and sorts the latencies for the percentiles.
    fn finish(&mut self) {
        self.ok = self.latencies_us.len() as u64;
        self.requests = self.ok + self.errors.values().sum::<u64>();
        self.latencies_us.sort_unstable();
        for micros in self.stages_us.values_mut() {
            micros.sort_unstable();
        }
    }
}

/// The request's `top_k`: none for 0, so the server chooses the depth from the budget.
fn requested_top_k(top_k: u32) -> Option<u32> {
    (top_k > 0).then_some(top_k)
}

/// One line per server stage: how many answers timed it, and its p50 and p99 in milliseconds.
fn print_stages(report: &RunReport) {
    println!();
    println!("| stage | answers | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    for (stage, micros) in &report.stages_us {
        let ms = |p: f64| percentile(micros, p) as f64 / 1e3;
        println!(
            "| {stage} | {} | {:.2} | {:.2} |",
            micros.len(),
            ms(50.0),
            ms(99.0)
        );
    }
    println!();
}

fn print_header() {
    println!("| mode | clients | writer | seconds | requests | QPS | p50 ms | p95 ms | p99 ms | max ms | cache hits | errors | writes/s |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
}

fn print_row(report: &RunReport) {
    let ms = |p: f64| percentile(&report.latencies_us, p) as f64 / 1e3;
    let errors = if report.errors.is_empty() {
        "none".to_string()
    } else {
        report
            .errors
            .iter()
            .map(|(code, count)| format!("{code}: {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let writes = if report.writer {
        format!(
            "{:.1}{}",
            report.writes as f64 / report.seconds,
            if report.write_errors > 0 {
                format!(" ({} failed)", report.write_errors)
            } else {
                String::new()
            }
        )
    } else {
        "–".to_string()
    };
    println!(
        "| {} | {} | {} | {:.1} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1}% | {} | {} |",
        match report.mode {
            Mode::Miss => "miss",
            Mode::Hit => "hit",
            Mode::WarmUp => "warm-up",
        },
        report.clients,
        if report.writer { "yes" } else { "no" },
        report.seconds,
        report.requests,
        report.ok as f64 / report.seconds,
        ms(50.0),
        ms(95.0),
        ms(99.0),
        report
            .latencies_us
            .last()
            .map_or(0.0, |&us| us as f64 / 1e3),
        100.0 * report.cache_hits as f64 / report.ok.max(1) as f64,
        errors,
        writes,
    );
}

/// Checks the arguments; returns the modes to run.
fn validate(args: &Args) -> anyhow::Result<Vec<Mode>> {
    let modes: Vec<Mode> = args
        .mode
        .iter()
        .map(|m| match m.as_str() {
            "miss" => Ok(Mode::Miss),
            "hit" => Ok(Mode::Hit),
            other => Err(anyhow::anyhow!(
                "unknown mode `{other}`: expected miss or hit"
            )),
        })
        .collect::<anyhow::Result<_>>()?;
    if args.clients.is_empty() || args.clients.contains(&0) {
        anyhow::bail!("--clients needs positive client counts");
    }
    if args.warm_up_seconds > 600 {
        anyhow::bail!("--warm-up-seconds must be in 0..=600");
    }
    if args.read_only_first > 600 {
        anyhow::bail!("--read-only-first must be in 0..=600");
    }
    if args.seconds == 0 || args.seconds > 600 {
        anyhow::bail!("--seconds must be in 1..=600");
    }
    if args.collection.is_some() && args.addr.is_none() {
        anyhow::bail!("--collection names a collection of the server given with --addr");
    }
    if let Some(address) = &args.addr {
        if !is_loopback(address) {
            anyhow::bail!("--addr must be a loopback address (127.0.0.1, localhost or [::1])");
        }
    }
    Ok(modes)
}

/// Creates `collection` and streams the dataset's documents into it, one document a message:
/// embedding a whole corpus takes longer than the deadline a single unary call gets.
async fn ingest_dataset(
    client: &mut LatheClient<Channel>,
    collection: &str,
    dataset: &Dataset,
) -> anyhow::Result<proto::WriteResponse> {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: collection.to_string(),
            settings: None,
        })
        .await
        .map_err(|s| anyhow::anyhow!("creating the collection: {}", s.message()))?;
    upload_in_batches(client, collection, dataset.proto_documents(false), 1)
        .await
        .map_err(|s| anyhow::anyhow!("ingesting: {}", s.message()))
}

/// The runs of the table: each client count, each mode, the read-only baseline first when one is
/// asked for.
fn run_shapes(args: &Args, modes: &[Mode]) -> Vec<RunShape> {
    let mut shapes = Vec::new();
    for &clients in &args.clients {
        for &mode in modes {
            let shape = |writer, seconds| RunShape {
                mode,
                clients,
                writer,
                seconds,
            };
            if args.writer && args.read_only_first > 0 {
                shapes.push(shape(false, args.read_only_first));
            }
            shapes.push(shape(args.writer, args.seconds));
        }
    }
    shapes
}

async fn main_async(args: Args) -> anyhow::Result<()> {
    let modes = validate(&args)?;
    let dataset = Arc::new(Dataset::load(&args.dataset)?);
    if dataset.queries.is_empty() || dataset.documents.is_empty() {
        anyhow::bail!("the dataset needs documents and queries");
    }
    let server =
        TargetServer::given_or_started(args.addr.as_deref(), &args.models_dir, args.cpu_threads)?;
    let mut client = connect(&server.address).await?;
    let (collection, contents) = match &args.collection {
        Some(existing) => (
            Arc::from(existing.as_str()),
            format!("collection {existing}"),
        ),
        None => {
            let collection: Arc<str> = Arc::from(unique_collection_name("load"));
            let ingested = ingest_dataset(&mut client, &collection, &dataset).await?;
            let contents = format!(
                "{} documents ({} sections)",
                ingested.documents, ingested.sections
            );
            (collection, contents)
        }
    };
    let questions = Arc::new(distinct_questions(&dataset));
    let depth = match requested_top_k(args.top_k) {
        Some(top_k) => top_k.to_string(),
        None => "from the budget".to_string(),
    };
    println!(
        "lathe-load: {contents}, {} questions ({} distinct); budget {}, top_k {depth}, default chunking; server {}\n",
        dataset.queries.len(),
        questions.len(),
        args.budget,
        if server.is_started_here() { "started by lathe-load (loopback gRPC)" } else { server.address.as_str() },
    );
    if let Some(mib) = resident_mib(server.pid()) {
        println!("resident memory after ingest: {mib:.0} MiB\n");
    }
    let shapes = run_shapes(&args, &modes);
    let target = LoadTarget {
        address: server.address.clone(),
        server_pid: server.pid(),
        collection: Arc::clone(&collection),
        dataset,
        questions,
        miss_counter: Arc::new(AtomicU64::new(0)),
        args: Arc::new(args),
    };
    if target.args.warm_up_seconds > 0 {
        let warm_up = RunShape {
            mode: Mode::WarmUp,
            clients: 1,
            writer: false,
            seconds: target.args.warm_up_seconds,
        };
        let report = run(&target, warm_up).await?;
        println!(
            "warm-up: {} requests in {:.1} s, not reported\n",
            report.requests, report.seconds
        );
    }
    if target.args.sample_every == 0 {
        print_header();
    }
    for (run_index, shape) in shapes.into_iter().enumerate() {
        let report = run(&target, shape).await?;
        if target.args.sample_every > 0 || (target.args.stages && run_index > 0) {
            println!();
            print_header();
        }
        print_row(&report);
        if target.args.stages {
            print_stages(&report);
        }
    }
    if target.args.collection.is_none() {
        let _ = client
            .delete_collection(proto::DeleteCollectionRequest {
                name: collection.to_string(),
            })
            .await;
    }
    server.stop()
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lathe-load: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main_async(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lathe-load: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
