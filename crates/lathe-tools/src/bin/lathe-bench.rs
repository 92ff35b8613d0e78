//! `lathe-bench`: the scale benchmark. For each corpus size it builds a collection of about N
//! sections from real text in a real `lathe serve` child process (its own data dir and config),
//! and measures what a deployment feels:
//! - build: ingest wall time (streamed uploads with `wait`) and MB/s of document text;
//! - the collection's size on disk after a clean stop;
//! - open time after a clean stop (SIGTERM) and after `kill -9` (one acknowledged write just
//!   before the kill): from spawning the process to the first successful Retrieve;
//! - resident memory of the server after open and after 1,000 queries: VmRSS, split into
//!   anonymous memory (RssAnon: heaps, graphs, caches) and file-backed pages (RssFile: mapped
//!   index files and libraries), which the kernel can drop and re-read;
//! - Retrieve p50/p99 with result-cache misses (every query text distinct; budget 1024 by
//!   default) from 1 client and from 8;
//! - dense ANN recall@10 against exact search: after the server stopped, the bench opens the
//!   collection's index in this process (library call, not gRPC), asks its dense index for the
//!   top 10 of each query vector and compares with a brute-force scan of the section vectors
//!   stored with the sections.
//!
//! The corpus is a folder of `.txt` files (e.g. `scripts/fetch-debian-docs.sh`'s output) or a
//! `docs.jsonl` (e.g. ../shared/eval/squad-a/docs.jsonl), repeated until the collection holds N
//! sections; copy `c > 0` of a document starts with "Copy c." and drops one word in eight
//! (chosen per copy), so copies are near, not exact, duplicates. Vectors come from the server's
//! `models.dense` (`static` by default: real vectors that cost almost nothing to make).
//!
//! Writes `results.md`, `results.csv` and `latency.svg` (latency and open time against corpus
//! size) to `--out`.
//!
//! Example: `lathe-bench --corpus /tmp/lathe-debian-docs --sizes 10000,100000`

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use plotters::prelude::*;
use tonic::transport::Channel;

use lathe_tools::client::{connect, serve_command, upload_in_batches};
use lathe_tools::eval::percentile;
use lathe_tools::eval::report::{draw_axes, draw_legend, draw_line_with_markers};
use lathe_tools::proto;
use lathe_tools::proto::lathe_client::LatheClient;

#[derive(Parser, Debug)]
#[command(
    name = "lathe-bench",
    about = "Scale benchmark: build, open, memory, latency and dense recall of a real lathe serve per corpus size"
)]
struct Args {
    /// A folder of .txt documents, or a docs.jsonl file.
    #[arg(long, default_value = "/tmp/lathe-debian-docs")]
    corpus: PathBuf,
    /// Collection sizes in sections (comma-separated), each built in a fresh data dir.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    sizes: Vec<usize>,
    /// The `lathe` binary to run; default: the one beside this program.
    #[arg(long)]
    lathe: Option<PathBuf>,
    #[arg(long, default_value = "./models")]
    models_dir: PathBuf,
    /// The server's `models.dense`: static, minilm or off (no recall figure then).
    #[arg(long, default_value = "static")]
    dense: String,
    /// Queries of the 1-client run and of the 8-client run (each its own distinct texts).
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Concurrent clients of the second latency run.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    #[arg(long, default_value_t = 1024)]
    budget: u32,
    /// Query vectors of the recall measurement.
    #[arg(long, default_value_t = 200)]
    recall_queries: usize,
    /// The dense search's candidate list (`dense.ef_search`) of the server and of the recall
    /// measurement; default: the server's default.
    #[arg(long)]
    ef_search: Option<usize>,
    /// Also measure recall@10 of one hnsw graph built over all the stored vectors with the
    /// index's graph parameters (printed beside the segmented index's): tells the data's
    /// difficulty apart from what segmenting costs.
    #[arg(long)]
    one_graph_recall: bool,
    /// M (`max_nb_connection`, 1..=256) of that one graph; default: the index's.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    one_graph_m: Option<usize>,
    /// `ef_construction` of that one graph (1..=4096); default: the index's.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    one_graph_ef_construction: Option<usize>,
    /// Level scale of that one graph (hnsw_rs's `modify_level_scale`, which takes 0.2 to 1.0:
    /// fewer upper layers below 1); default: the index's (1).
    #[arg(long)]
    one_graph_level_scale: Option<f64>,
    /// Candidate lists (`ef`) that one graph is searched with, each reported with its recall and
    /// mean search time; default: the index's `ef_search`.
    #[arg(long, value_delimiter = ',')]
    one_graph_ef: Vec<usize>,
    /// Search that one graph as the index searches a segment: through hnsw_rs's filtered search
    /// (here accepting every slot), which keeps walking after the unfiltered search would stop.
    #[arg(long)]
    one_graph_filtered: bool,
    /// Documents per upload call while building.
    #[arg(long, default_value_t = 256)]
    upload_documents: usize,
    /// The collection's `section_tokens` (how large its sections are cut); default: the
    /// server's (256).
    #[arg(long)]
    section_tokens: Option<u32>,
    /// Where results.md, results.csv and latency.svg go.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Parent of the data dirs (one per size, removed afterwards unless --keep).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Keep each size's data dir.
    #[arg(long)]
    keep: bool,
    /// Reuse a size's data dir kept by an earlier run with the same --work-dir (and --keep):
    /// skip the build, take its figures from `size-<N>.build.json` beside the data dir, and
    /// measure the rest again. Implies --keep.
    #[arg(long)]
    reuse: bool,
    /// Measure nothing: write the table and plot of earlier runs' results.csv files (e.g. sizes
    /// run one at a time) to --out.
    #[arg(long, value_delimiter = ',')]
    from_csv: Vec<PathBuf>,
}

/// One document of the source corpus.
#[derive(Clone, Debug)]
struct SourceDocument {
    name: String,
    text: String,
}

/// What one size measured: one row of the table.
#[derive(Clone, Debug, Default, PartialEq)]
struct SizeReport {
    target_sections: usize,
    sections: u64,
    documents: u64,
    text_bytes: u64,
    build_seconds: f64,
    /// CPU time (user + system) the server spent during the build: on a shared machine the wall
    /// time depends on the neighbours, this does not.
    build_cpu_seconds: f64,
    disk_bytes: u64,
    open_clean_seconds: f64,
    open_killed_seconds: f64,
    rss_open: Resident,
    rss_queries: Resident,
    one_client: Latency,
    many_clients: Latency,
    /// The server's own stage timings (RetrieveResponse.timings) of the 1-client run: stage,
    /// p50 ms, p99 ms, in the order the server reports them. Not in the CSV.
    one_client_stages: Vec<StageLatency>,
    /// `None` without a dense index.
    recall_at_10: Option<f64>,
}

/// Resident memory of a process, in MiB (from /proc/<pid>/status).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Resident {
    /// VmRSS.
    total: f64,
    /// RssAnon: heaps, stacks, anonymous maps.
    anon: f64,
    /// RssFile: pages of mapped files (index files, the binary, libraries).
    file: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct StageLatency {
    stage: String,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    qps: f64,
}

impl Resident {
    /// A table cell: "total (anon + file)".
    fn cell(&self) -> String {
        format!("{:.0} ({:.0} + {:.0})", self.total, self.anon, self.file)
    }
}

impl SizeReport {
    fn build_mb_per_second(&self) -> f64 {
        if self.build_seconds <= 0.0 {
            return 0.0;
        }
        self.text_bytes as f64 / 1e6 / self.build_seconds
    }

    fn build_mb_per_cpu_second(&self) -> f64 {
        if self.build_cpu_seconds <= 0.0 {
            return 0.0;
        }
        self.text_bytes as f64 / 1e6 / self.build_cpu_seconds
    }
}

// ------------------------------------------------------------------------------------------------
// The corpus

fn load_corpus(path: &Path) -> anyhow::Result<Vec<SourceDocument>> {
    let mut documents = if path.is_dir() {
        load_text_folder(path)?
    } else {
        load_jsonl(path)?
    };
    documents.retain(|document| !document.text.trim().is_empty());
    if documents.is_empty() {
        anyhow::bail!("no documents in {}", path.display());
    }
    Ok(documents)
}

fn load_text_folder(folder: &Path) -> anyhow::Result<Vec<SourceDocument>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(folder)
        .with_context(|| format!("listing {}", folder.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok(SourceDocument {
                name: path
                    .file_stem()
                    .map(|stem| stem.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                text: String::from_utf8_lossy(&bytes).into_owned(),
            })
        })
        .collect()
}

fn load_jsonl(path: &Path) -> anyhow::Result<Vec<SourceDocument>> {
    #[derive(serde::Deserialize)]
    struct Line {
        doc_id: String,
        text: String,
    }
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut documents = Vec::new();
    for (number, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}", path.display(), number + 1))?;
        documents.push(SourceDocument {
            name: parsed.doc_id,
            text: parsed.text,
        });
    }
    Ok(documents)
}

/// A cheap deterministic hash of (copy, word position): which words a copy drops.
fn drops_word(copy: u64, position: u64) -> bool {
    let mut x =
        copy.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ position.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x.is_multiple_of(8)
}

/// Copy `copy` of `text`: the text itself for copy 0; else "Copy c." and the text with one word
/// in eight dropped (lines and blank lines kept, so sectioning sees the same structure).
fn variant_text(text: &str, copy: u64) -> String {
    if copy == 0 {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&format!("Copy {copy}.\n\n"));
    let mut position = 0u64;
    for line in text.split_inclusive('\n') {
        let (body, ending) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let mut kept: Vec<&str> = Vec::new();
        for word in body.split(' ') {
            position += 1;
            if word.is_empty() || !drops_word(copy, position) {
                kept.push(word);
            }
        }
        out.push_str(&kept.join(" "));
        out.push_str(ending);
    }
    out
}

/// Distinct query texts from the corpus: the first eight words of lines with at least six words
/// of letters, spread evenly over all such lines.
fn corpus_queries(documents: &[SourceDocument], wanted: usize) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut candidates = Vec::new();
    for document in documents {
        for line in document.text.lines() {
            let words: Vec<&str> = line
                .split_whitespace()
                .filter(|word| {
                    word.chars()
                        .all(|c| c.is_alphabetic() || c == ',' || c == '.')
                })
                .take(8)
                .collect();
            if words.len() < 6 {
                continue;
            }
            let query = words.join(" ").to_lowercase();
            if seen.insert(query.clone()) {
                candidates.push(query);
            }
        }
    }
    if candidates.len() <= wanted {
        return candidates;
    }
    (0..wanted)
        .map(|i| candidates[i * candidates.len() / wanted].clone())
        .collect()
}

// ------------------------------------------------------------------------------------------------
// The server process

/// A `lathe serve` child with its log lines.
struct ServerProcess {
    child: Child,
    log: mpsc::Receiver<String>,
    spawned_at: Instant,
}

/// How the bench starts servers: binary, models, dense model and search setting.
struct ServerCommand {
    binary: PathBuf,
    models_dir: PathBuf,
    dense: String,
    ef_search: Option<usize>,
}

impl ServerCommand {
    fn spawn(&self, data_dir: &Path) -> anyhow::Result<ServerProcess> {
        let spawned_at = Instant::now();
        let mut command = serve_command(&self.binary, &self.models_dir, data_dir, &self.dense);
        if let Some(ef_search) = self.ef_search {
            command.env("LATHE_DENSE__EF_SEARCH", ef_search.to_string());
        }
        let mut child = command
            .env("LATHE_LOG__FILTER", "info")
            // A build streams one long upload: the bench, not the server, bounds it.
            .env("LATHE_SERVER__REQUEST_TIMEOUT_MS", "3600000")
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let stderr = child.stderr.take().context("the server's stderr")?;
        let (line_sender, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = line_sender.send(line);
            }
        });
        Ok(ServerProcess {
            child,
            log,
            spawned_at,
        })
    }
}

impl ServerProcess {
    /// Waits for the "lathe serving" log line and returns the bound address.
    fn wait_serving(&mut self, limit: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.log.recv_timeout(left) {
                Ok(line) => line,
                Err(error) => anyhow::bail!(
                    "lathe serve did not log `lathe serving` ({error}); last lines:\n{}",
                    seen.iter()
                        .rev()
                        .take(20)
                        .rev()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            };
            if line.contains("lathe serving") {
                return serving_address(&line)
                    .with_context(|| format!("no address in the serving line: {line}"));
            }
            seen.push(line);
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the exit (graceful: drain, commit, close).
    fn stop(mut self) -> anyhow::Result<()> {
        signal(self.pid(), "-TERM")?;
        let status = self.child.wait().context("waiting for lathe to exit")?;
        if !status.success() {
            anyhow::bail!("lathe exited with {status} after SIGTERM");
        }
        Ok(())
    }

    /// SIGKILL, then reaps the process.
    fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().context("kill -9")?;
        self.child.wait().context("waiting for the killed lathe")?;
        Ok(())
    }
}

fn signal(pid: u32, which: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .context("running kill")?;
    if !status.success() {
        anyhow::bail!("kill {which} {pid} failed: {status}");
    }
    Ok(())
}

/// The `address` field of the JSON "lathe serving" log line.
fn serving_address(line: &str) -> Option<String> {
    let rest = line.split("\"address\":\"").nth(1)?;
    Some(rest.chars().take_while(|c| *c != '"').collect())
}

/// Resident memory of `pid`.
fn resident(pid: u32) -> anyhow::Result<Resident> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_resident(&status).with_context(|| format!("no VmRSS, RssAnon or RssFile in {path}"))
}

/// CPU seconds (user + system) `pid` has used so far.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks = parse_cpu_ticks(&stat).with_context(|| format!("no utime/stime in {path}"))?;
    Ok(ticks as f64 / ticks_per_second)
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line; the command name (field 2) may
/// hold spaces, so fields are counted after its closing parenthesis.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

fn parse_resident(status: &str) -> Option<Resident> {
    let mib = |field: &str| -> Option<f64> {
        let line = status.lines().find(|line| line.starts_with(field))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    };
    Some(Resident {
        total: mib("VmRSS:")?,
        anon: mib("RssAnon:")?,
        file: mib("RssFile:")?,
    })
}

/// Bytes of every file under `path`.
fn disk_bytes(path: &Path) -> u64 {
    walkdir::WalkDir::new(path)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .sum()
}

// ------------------------------------------------------------------------------------------------
// gRPC steps

/// The queries of one size, handed out once each so that no Retrieve hits the result cache.
struct QueryFeed {
    queries: Vec<String>,
    next: AtomicUsize,
}

impl QueryFeed {
    fn take(&self) -> anyhow::Result<String> {
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
async fn first_retrieve(
    address: &str,
    collection: &str,
    feed: &QueryFeed,
    budget: u32,
    spawned_at: Instant,
) -> anyhow::Result<(LatheClient<Channel>, f64)> {
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
async fn measure_latency(
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
struct Built {
    documents: u64,
    sections: u64,
    text_bytes: u64,
    seconds: f64,
}

/// Creates `collection` and uploads copies of the corpus until it holds `target` sections.
async fn build_collection(
    client: &mut LatheClient<Channel>,
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

/// Document `i` of the endless corpus: copy `i / len` of source document `i % len`.
fn corpus_document(corpus: &[SourceDocument], i: u64) -> proto::Document {
    let source = &corpus[(i % corpus.len() as u64) as usize];
    let copy = i / corpus.len() as u64;
    proto::Document {
        id: format!("c{copy}-{}", source.name),
        title: source.name.clone(),
        text: variant_text(&source.text, copy),
        format: proto::DocumentFormat::Plain as i32,
        ..Default::default()
    }
}

/// One acknowledged write, so the data a `kill -9` interrupts ends in a fresh commit.
async fn write_one_more(
    client: &mut LatheClient<Channel>,
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
        })
        .await
        .map_err(|status| anyhow::anyhow!("the write before kill -9: {status}"))?;
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// One size

/// Everything a size's run needs besides its size.
struct Bench {
    args: Args,
    server: ServerCommand,
    corpus: Vec<SourceDocument>,
    runtime: tokio::runtime::Runtime,
    work_dir: PathBuf,
}

const COLLECTION: &str = "bench";
const START_LIMIT: Duration = Duration::from_secs(3600);

impl Bench {
    fn run_size(&self, target: usize) -> anyhow::Result<SizeReport> {
        let data_dir = self.work_dir.join(format!("size-{target}"));
        let build_record = self.work_dir.join(format!("size-{target}.build.json"));
        let per_run = self.args.queries * 2 + 4;
        let feed = Arc::new(QueryFeed {
            queries: corpus_queries(&self.corpus, per_run.max(self.args.recall_queries)),
            next: AtomicUsize::new(0),
        });
        let mut report = SizeReport {
            target_sections: target,
            ..SizeReport::default()
        };
        let reused = self.args.reuse && data_dir.exists() && build_record.exists();
        if reused {
            eprintln!("size {target}: reusing {}", data_dir.display());
            read_build_record(&build_record, &mut report)?;
        } else {
            if data_dir.exists() {
                std::fs::remove_dir_all(&data_dir)
                    .with_context(|| format!("removing {}", data_dir.display()))?;
            }
            eprintln!("size {target}: building in {}", data_dir.display());
            self.build(&data_dir, target, &mut report)?;
            write_build_record(&build_record, &report)?;
        }
        report.disk_bytes = disk_bytes(&data_dir.join("collections"));
        eprintln!("size {target}: open after a clean stop, queries");
        self.open_and_query(&data_dir, &feed, &mut report)?;
        eprintln!("size {target}: open after kill -9");
        report.open_killed_seconds = self.open_after_kill(&data_dir, &feed)?;
        if self.args.dense == "static" {
            eprintln!("size {target}: dense recall@10");
            let index_path = data_dir.join("collections").join(COLLECTION).join("index");
            let recall_queries = &feed.queries[..self.args.recall_queries.min(feed.queries.len())];
            report.recall_at_10 = Some(self.dense_recall(&index_path, recall_queries)?);
        }
        if !self.args.keep && !self.args.reuse {
            let _ = std::fs::remove_dir_all(&data_dir);
            let _ = std::fs::remove_file(&build_record);
        }
        Ok(report)
    }

    /// Recall@10 of the stopped server's dense index, measured by `lathe dense-recall` (which
    /// opens the index in its own process) over `queries`.
    fn dense_recall(&self, index_path: &Path, queries: &[String]) -> anyhow::Result<f64> {
        let queries_path = self.work_dir.join("recall-queries.txt");
        std::fs::write(&queries_path, queries.join("\n"))
            .with_context(|| format!("writing {}", queries_path.display()))?;
        let args = &self.args;
        let mut command = Command::new(&self.server.binary);
        command
            .arg("dense-recall")
            .arg("--index")
            .arg(index_path)
            .arg("--models-dir")
            .arg(&args.models_dir)
            .arg("--queries")
            .arg(&queries_path);
        if let Some(ef_search) = args.ef_search {
            command.args(["--ef-search", &ef_search.to_string()]);
        }
        if args.one_graph_recall {
            command.arg("--one-graph");
            let options = [
                ("--one-graph-m", args.one_graph_m.map(|m| m.to_string())),
                (
                    "--one-graph-ef-construction",
                    args.one_graph_ef_construction.map(|ef| ef.to_string()),
                ),
                (
                    "--one-graph-level-scale",
                    args.one_graph_level_scale.map(|scale| scale.to_string()),
                ),
            ];
            for (flag, value) in options {
                if let Some(value) = value {
                    command.args([flag, &value]);
                }
            }
            if !args.one_graph_ef.is_empty() {
                let efs: Vec<String> = args.one_graph_ef.iter().map(usize::to_string).collect();
                command.args(["--one-graph-ef", &efs.join(",")]);
            }
            if args.one_graph_filtered {
                command.arg("--one-graph-filtered");
            }
        }
        let output = command
            .stderr(Stdio::inherit())
            .output()
            .context("running lathe dense-recall")?;
        if !output.status.success() {
            anyhow::bail!("lathe dense-recall failed: {}", output.status);
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        stdout
            .trim()
            .parse()
            .with_context(|| format!("lathe dense-recall printed `{}`", stdout.trim()))
    }

    fn build(&self, data_dir: &Path, target: usize, report: &mut SizeReport) -> anyhow::Result<()> {
        let mut server = self.server.spawn(data_dir)?;
        let address = server.wait_serving(START_LIMIT)?;
        let cpu_before = cpu_seconds(server.pid())?;
        let built = self.runtime.block_on(async {
            let mut client = connect(&address).await?;
            build_collection(
                &mut client,
                COLLECTION,
                &self.corpus,
                target,
                self.args.upload_documents,
                self.args.section_tokens,
            )
            .await
        })?;
        report.sections = built.sections;
        report.documents = built.documents;
        report.text_bytes = built.text_bytes;
        report.build_seconds = built.seconds;
        report.build_cpu_seconds = cpu_seconds(server.pid())? - cpu_before;
        server.stop()
    }

    /// Opens after the clean stop of the build, measures memory and latency, stops cleanly.
    fn open_and_query(
        &self,
        data_dir: &Path,
        feed: &Arc<QueryFeed>,
        report: &mut SizeReport,
    ) -> anyhow::Result<()> {
        let mut server = self.server.spawn(data_dir)?;
        let address = server.wait_serving(START_LIMIT)?;
        let (queries, clients, budget) = (self.args.queries, self.args.clients, self.args.budget);
        self.runtime.block_on(async {
            let (_client, open_seconds) =
                first_retrieve(&address, COLLECTION, feed, budget, server.spawned_at).await?;
            report.open_clean_seconds = open_seconds;
            report.rss_open = resident(server.pid())?;
            (report.one_client, report.one_client_stages) =
                measure_latency(&address, COLLECTION, Arc::clone(feed), queries, 1, budget).await?;
            report.rss_queries = resident(server.pid())?;
            (report.many_clients, _) = measure_latency(
                &address,
                COLLECTION,
                Arc::clone(feed),
                queries,
                clients,
                budget,
            )
            .await?;
            anyhow::Ok(())
        })?;
        server.stop()
    }

    /// Writes one document, kills the server with SIGKILL, and times the next open; stops that
    /// server cleanly.
    fn open_after_kill(&self, data_dir: &Path, feed: &Arc<QueryFeed>) -> anyhow::Result<f64> {
        let mut server = self.server.spawn(data_dir)?;
        let address = server.wait_serving(START_LIMIT)?;
        self.runtime.block_on(async {
            let mut client = connect(&address).await?;
            write_one_more(&mut client, COLLECTION, &self.corpus).await
        })?;
        server.kill()?;
        let mut server = self.server.spawn(data_dir)?;
        let address = server.wait_serving(START_LIMIT)?;
        let (_, open_seconds) = self.runtime.block_on(first_retrieve(
            &address,
            COLLECTION,
            feed,
            self.args.budget,
            server.spawned_at,
        ))?;
        server.stop()?;
        Ok(open_seconds)
    }
}

/// The build's figures, kept beside its data dir for `--reuse`.
fn write_build_record(path: &Path, report: &SizeReport) -> anyhow::Result<()> {
    let record = serde_json::json!({
        "sections": report.sections,
        "documents": report.documents,
        "text_bytes": report.text_bytes,
        "build_seconds": report.build_seconds,
        "build_cpu_seconds": report.build_cpu_seconds,
    });
    std::fs::write(path, record.to_string()).with_context(|| format!("writing {}", path.display()))
}

fn read_build_record(path: &Path, report: &mut SizeReport) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let record: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let number = |name: &str| {
        record[name]
            .as_f64()
            .with_context(|| format!("{} has no `{name}`", path.display()))
    };
    report.sections = number("sections")? as u64;
    report.documents = number("documents")? as u64;
    report.text_bytes = number("text_bytes")? as u64;
    report.build_seconds = number("build_seconds")?;
    report.build_cpu_seconds = number("build_cpu_seconds")?;
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Reports

const TABLE_HEADER: &str = "| sections | documents | text MB | build s | build MB/s | build MB/CPU-s | disk MiB | open clean s | open kill -9 s | RSS open MiB (anon + file) | RSS +queries MiB (anon + file) | p50 1c ms | p99 1c ms | p50 Nc ms | p99 Nc ms | QPS Nc | recall@10 |";

fn markdown_table(reports: &[SizeReport], clients: usize) -> String {
    let mut table = TABLE_HEADER.replace(" Nc", &format!(" {clients}c"));
    table.push('\n');
    table.push_str(
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        table.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} |\n",
            r.sections,
            r.documents,
            r.text_bytes as f64 / 1e6,
            r.build_seconds,
            r.build_mb_per_second(),
            r.build_mb_per_cpu_second(),
            r.disk_bytes as f64 / (1024.0 * 1024.0),
            r.open_clean_seconds,
            r.open_killed_seconds,
            r.rss_open.cell(),
            r.rss_queries.cell(),
            r.one_client.p50_ms,
            r.one_client.p99_ms,
            r.many_clients.p50_ms,
            r.many_clients.p99_ms,
            r.many_clients.qps,
            r.recall_at_10.map_or("–".to_string(), |recall| format!("{recall:.3}")),
        ));
    }
    table
}

/// The server's stage timings of each size's 1-client run (sizes read back from a CSV have none).
fn stage_table(reports: &[SizeReport]) -> String {
    let mut table = String::new();
    for r in reports.iter().filter(|r| !r.one_client_stages.is_empty()) {
        table.push_str(&format!(
            "\nServer stage timings at {} sections, 1 client (p50 / p99 ms):\n\n| stage | p50 ms | p99 ms |\n|---|---:|---:|\n",
            r.sections
        ));
        for stage in &r.one_client_stages {
            table.push_str(&format!(
                "| {} | {:.2} | {:.2} |\n",
                stage.stage, stage.p50_ms, stage.p99_ms
            ));
        }
    }
    table
}

/// The rows of a `results.csv` (columns found by name; one missing, as in files written before
/// it existed, reads as 0).
fn parse_csv(text: &str) -> anyhow::Result<Vec<SizeReport>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().context("empty CSV")?.split(',').collect();
    let mut reports = Vec::new();
    for line in lines.filter(|line| !line.trim().is_empty()) {
        let values: Vec<&str> = line.split(',').collect();
        let number = |name: &str| -> f64 {
            header
                .iter()
                .position(|column| *column == name)
                .and_then(|i| values.get(i))
                .and_then(|value| value.parse().ok())
                .unwrap_or(0.0)
        };
        let recall = number("recall_at_10");
        reports.push(SizeReport {
            target_sections: number("sections") as usize,
            sections: number("sections") as u64,
            documents: number("documents") as u64,
            text_bytes: number("text_bytes") as u64,
            build_seconds: number("build_s"),
            build_cpu_seconds: number("build_cpu_s"),
            disk_bytes: number("disk_bytes") as u64,
            open_clean_seconds: number("open_clean_s"),
            open_killed_seconds: number("open_kill9_s"),
            rss_open: Resident {
                total: number("rss_open_mib"),
                anon: number("rss_open_anon_mib"),
                file: number("rss_open_file_mib"),
            },
            rss_queries: Resident {
                total: number("rss_queries_mib"),
                anon: number("rss_queries_anon_mib"),
                file: number("rss_queries_file_mib"),
            },
            one_client: Latency {
                p50_ms: number("p50_1c_ms"),
                p99_ms: number("p99_1c_ms"),
                qps: 0.0,
            },
            many_clients: Latency {
                p50_ms: number("p50_nc_ms"),
                p99_ms: number("p99_nc_ms"),
                qps: number("qps_nc"),
            },
            recall_at_10: (recall > 0.0).then_some(recall),
            one_client_stages: Vec::new(),
        });
    }
    Ok(reports)
}

/// `--from-csv`: the table and plot of earlier runs, sorted by size.
fn replot(args: &Args) -> anyhow::Result<()> {
    let mut reports = Vec::new();
    for path in &args.from_csv {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        reports.extend(parse_csv(&text).with_context(|| format!("parsing {}", path.display()))?);
    }
    reports.sort_by_key(|r| r.sections);
    let files: Vec<String> = args
        .from_csv
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    write_outputs(
        args,
        &reports,
        &format!("## lathe-bench (from {})\n", files.join(", ")),
    )
}

fn csv_table(reports: &[SizeReport]) -> String {
    let mut csv = String::from("sections,documents,text_bytes,build_s,build_mb_s,build_cpu_s,disk_bytes,open_clean_s,open_kill9_s,rss_open_mib,rss_open_anon_mib,rss_open_file_mib,rss_queries_mib,rss_queries_anon_mib,rss_queries_file_mib,p50_1c_ms,p99_1c_ms,p50_nc_ms,p99_nc_ms,qps_nc,recall_at_10\n");
    for r in reports {
        csv.push_str(&format!(
            "{},{},{},{:.3},{:.3},{:.3},{},{:.3},{:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.3},{:.3},{:.3},{:.3},{:.1},{}\n",
            r.sections,
            r.documents,
            r.text_bytes,
            r.build_seconds,
            r.build_mb_per_second(),
            r.build_cpu_seconds,
            r.disk_bytes,
            r.open_clean_seconds,
            r.open_killed_seconds,
            r.rss_open.total,
            r.rss_open.anon,
            r.rss_open.file,
            r.rss_queries.total,
            r.rss_queries.anon,
            r.rss_queries.file,
            r.one_client.p50_ms,
            r.one_client.p99_ms,
            r.many_clients.p50_ms,
            r.many_clients.p99_ms,
            r.many_clients.qps,
            r.recall_at_10
                .map_or(String::new(), |recall| format!("{recall:.4}")),
        ));
    }
    csv
}

/// Latency and open time (both in ms, log scales) against corpus size.
fn latency_svg(path: &Path, reports: &[SizeReport], clients: usize) -> anyhow::Result<()> {
    let plot_error = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    let series: Vec<(String, Vec<(f64, f64)>)> = vec![
        (
            "p50, 1 client".into(),
            points(reports, |r| r.one_client.p50_ms),
        ),
        (
            "p99, 1 client".into(),
            points(reports, |r| r.one_client.p99_ms),
        ),
        (
            format!("p50, {clients} clients"),
            points(reports, |r| r.many_clients.p50_ms),
        ),
        (
            format!("p99, {clients} clients"),
            points(reports, |r| r.many_clients.p99_ms),
        ),
        (
            "open after clean stop".into(),
            points(reports, |r| r.open_clean_seconds * 1e3),
        ),
        (
            "open after kill -9".into(),
            points(reports, |r| r.open_killed_seconds * 1e3),
        ),
    ];
    let xs = reports.iter().map(|r| r.sections.max(1) as f64);
    let ys = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| y.max(0.01)));
    let (x_low, x_high) = bounds(xs);
    let (y_low, y_high) = bounds(ys);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Retrieve latency and open time vs corpus size",
            ("sans-serif", 24),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (x_low * 0.7..x_high * 1.4).log_scale(),
            (y_low * 0.7..y_high * 1.4).log_scale(),
        )
        .map_err(|e| plot_error(&e))?;
    draw_axes(&mut chart, "sections", "milliseconds").map_err(|e| plot_error(&e))?;
    for (i, (label, points)) in series.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        draw_line_with_markers(&mut chart, &label, points, color).map_err(|e| plot_error(&e))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

fn points(reports: &[SizeReport], value: impl Fn(&SizeReport) -> f64) -> Vec<(f64, f64)> {
    reports
        .iter()
        .map(|r| (r.sections.max(1) as f64, value(r).max(0.01)))
        .collect()
}

/// (min, max) of positive values; (1, 10) when there are none.
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (low, high) = values.fold((f64::INFINITY, 0.0f64), |(low, high), v| {
        (low.min(v), high.max(v))
    });
    if !low.is_finite() || high <= 0.0 {
        return (1.0, 10.0);
    }
    (low, high.max(low * 1.01))
}

fn write_outputs(args: &Args, reports: &[SizeReport], header: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let markdown = format!(
        "{header}\n{}\n{}",
        markdown_table(reports, args.clients),
        stage_table(reports)
    );
    std::fs::write(args.out.join("results.md"), &markdown).context("writing results.md")?;
    std::fs::write(args.out.join("results.csv"), csv_table(reports))
        .context("writing results.csv")?;
    latency_svg(&args.out.join("latency.svg"), reports, args.clients)?;
    println!("{markdown}");
    Ok(())
}

// ------------------------------------------------------------------------------------------------

fn validate(args: &Args) -> anyhow::Result<()> {
    if args.sizes.is_empty() || args.sizes.contains(&0) {
        anyhow::bail!("--sizes needs positive section counts");
    }
    if !["static", "minilm", "off"].contains(&args.dense.as_str()) {
        anyhow::bail!(
            "--dense must be static, minilm or off, not `{}`",
            args.dense
        );
    }
    if args.clients == 0 || args.queries == 0 {
        anyhow::bail!("--clients and --queries must be positive");
    }
    Ok(())
}

/// The `lathe` binary beside this one (cargo puts both in the same target folder).
fn default_lathe_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating lathe-bench")?;
    let binary = me.with_file_name("lathe");
    if !binary.exists() {
        anyhow::bail!("{} not found; build it or pass --lathe", binary.display());
    }
    Ok(binary)
}

fn run(args: Args) -> anyhow::Result<()> {
    if !args.from_csv.is_empty() {
        return replot(&args);
    }
    validate(&args)?;
    let corpus = load_corpus(&args.corpus)?;
    let binary = match &args.lathe {
        Some(binary) => binary.clone(),
        None => default_lathe_binary()?,
    };
    let (_temporary, work_dir) = match &args.work_dir {
        Some(dir) => (None, dir.clone()),
        None => {
            let dir = tempfile::Builder::new().prefix("lathe-bench-").tempdir()?;
            let path = dir.path().to_path_buf();
            (Some(dir), path)
        }
    };
    let header = format!(
        "## lathe-bench\n\ncorpus {} ({} documents, {:.1} MB, repeated with variations), models.dense = {}{}, section_tokens {}, budget {}, {} queries per latency run (each text once: result-cache misses), {} clients in the second run, recall over {} query vectors; server {}\n",
        args.corpus.display(),
        corpus.len(),
        corpus.iter().map(|d| d.text.len()).sum::<usize>() as f64 / 1e6,
        args.dense,
        args.ef_search
            .map_or(String::new(), |ef| format!(", dense.ef_search = {ef}")),
        args.section_tokens
            .map_or_else(|| "the server's".to_string(), |tokens| tokens.to_string()),
        args.budget,
        args.queries,
        args.clients,
        args.recall_queries,
        binary.display(),
    );
    let bench = Bench {
        server: ServerCommand {
            binary,
            models_dir: args.models_dir.clone(),
            dense: args.dense.clone(),
            ef_search: args.ef_search,
        },
        corpus,
        runtime: tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?,
        work_dir,
        args,
    };
    let mut reports = Vec::new();
    for &size in &bench.args.sizes {
        reports.push(bench.run_size(size)?);
        // Written after every size, so a long run leaves what it measured so far.
        write_outputs(&bench.args, &reports, &header)?;
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lathe-bench: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_differ_from_the_source_and_from_each_other_but_keep_its_lines() {
        let text = "one two three four five six seven eight nine ten\n\nsecond paragraph here\n";
        assert_eq!(variant_text(text, 0), text);
        let first = variant_text(text, 1);
        let second = variant_text(text, 2);
        assert!(first.starts_with("Copy 1.\n\n"), "{first}");
        assert_ne!(first, second);
        assert_eq!(first.lines().count(), text.lines().count() + 2);
        // Some words of a long text are dropped, most kept.
        let long: String = (0..800).map(|i| format!("w{i} ")).collect();
        let kept = variant_text(&long, 3).split_whitespace().count() - 2;
        assert!((600..800).contains(&kept), "{kept} of 800 words kept");
    }

    #[test]
    fn corpus_queries_are_distinct_word_lines_spread_over_the_corpus() {
        let documents = vec![SourceDocument {
            name: "a".into(),
            text: "Short line.\nthe quick brown fox jumps over the lazy dog again\nthe quick brown fox jumps over the lazy dog again\nanother line with enough plain words in it\n====\n".into(),
        }];
        let queries = corpus_queries(&documents, 10);
        assert_eq!(
            queries,
            [
                "the quick brown fox jumps over the lazy",
                "another line with enough plain words in it"
            ]
        );
        assert_eq!(corpus_queries(&documents, 1).len(), 1);
    }

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
    fn latency_percentiles_and_rss_parse() {
        let latency = latency_summary((1..=100).rev().map(|ms| ms * 1000).collect(), 2.0);
        assert_eq!(latency.p50_ms, 50.0);
        assert_eq!(latency.p99_ms, 99.0);
        assert_eq!(latency.qps, 50.0);
        let status = "Name:\tlathe\nVmPeak:\t  900 kB\nVmRSS:\t  204800 kB\nRssAnon:\t  153600 kB\nRssFile:\t   51200 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(
            parse_resident(status),
            Some(Resident {
                total: 200.0,
                anon: 150.0,
                file: 50.0
            })
        );
        assert_eq!(parse_resident("Name:\tlathe\nVmRSS:\t  204800 kB\n"), None);
        let stat = "4242 (lathe (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 11 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        let line = r#"{"fields":{"message":"lathe serving","address":"127.0.0.1:4321"}}"#;
        assert_eq!(serving_address(line).as_deref(), Some("127.0.0.1:4321"));
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

    #[test]
    fn the_table_and_csv_have_one_row_per_size_and_the_plot_is_drawn() {
        let report = SizeReport {
            target_sections: 200,
            sections: 203,
            documents: 50,
            text_bytes: 2_000_000,
            build_seconds: 4.0,
            build_cpu_seconds: 2.0,
            disk_bytes: 3 * 1024 * 1024,
            open_clean_seconds: 0.5,
            open_killed_seconds: 0.6,
            rss_open: Resident {
                total: 150.0,
                anon: 120.0,
                file: 30.0,
            },
            rss_queries: Resident {
                total: 160.0,
                anon: 125.0,
                file: 35.0,
            },
            one_client: Latency {
                p50_ms: 3.0,
                p99_ms: 9.0,
                qps: 300.0,
            },
            many_clients: Latency {
                p50_ms: 6.0,
                p99_ms: 20.0,
                qps: 900.0,
            },
            recall_at_10: Some(0.987),
            one_client_stages: vec![StageLatency {
                stage: "coarse".into(),
                p50_ms: 1.5,
                p99_ms: 4.0,
            }],
        };
        let table = markdown_table(std::slice::from_ref(&report), 8);
        assert!(table.contains("| p50 8c ms |"), "{table}");
        assert!(
            table.contains("| 203 | 50 | 2.0 | 4.0 | 0.50 | 1.00 | 3 | 0.50 | 0.60 | 150 (120 + 30) | 160 (125 + 35) | 3.00 | 9.00 | 6.00 | 20.00 | 900 | 0.987 |"),
            "{table}"
        );
        let csv = csv_table(std::slice::from_ref(&report));
        assert_eq!(csv.lines().count(), 2);
        let mut read_back = parse_csv(&csv).unwrap();
        assert_eq!(read_back.len(), 1);
        // The CSV keeps 1-client QPS out and the target size is the size built.
        read_back[0].one_client.qps = report.one_client.qps;
        read_back[0].target_sections = report.target_sections;
        read_back[0].one_client_stages = report.one_client_stages.clone();
        assert!(stage_table(std::slice::from_ref(&report)).contains("| coarse | 1.50 | 4.00 |"));
        assert_eq!(read_back[0], report);
        assert_eq!(
            csv.lines().next().unwrap().split(',').count(),
            csv.lines().nth(1).unwrap().split(',').count()
        );
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("latency.svg");
        latency_svg(&svg, &[report], 8).unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.contains("open after kill -9"), "legend missing");
    }
}
