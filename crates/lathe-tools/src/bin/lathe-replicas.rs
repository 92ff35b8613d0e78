//! `lathe-replicas`: what replication over NATS JetStream costs and buys, measured on real
//! processes on loopback: a `nats-server -js` and `lathe serve` replicas (children of this tool).
//!
//! 1. **Build**: the dataset (`docs.jsonl`, `--copies` times, each copy's text prefixed with
//!    "Copy k." so that every copy is a new version) is uploaded through replica 0.
//! 2. **Bootstrap**: replicas 1..N start with empty data dirs; time from spawn until each reports
//!    SERVING (caught up), and the catch-up rate in log entries, sections and MB of log per second.
//! 3. **Read throughput**: `--clients` concurrent clients spread round-robin over the first 1, 2,
//!    …, N replicas for `--seconds` each; every request is a result-cache miss (each pass over the
//!    questions raises the budget by one token); QPS and latency percentiles.
//! 4. **Write latency**: `--writes` single-document upserts acknowledged by JetStream (no `wait`),
//!    the same with `wait` (visible on the replica that took it), and, as the baseline, the same
//!    writes with `wait` on a single-node server (no replication) started beside them.
//! 5. **Replication lag** under a sustained write load: one writer upserting batches of 8
//!    documents without `wait` for `--seconds` on replica 0 while the other replicas' lag
//!    (`lathe_replication_lag_seconds`) and distance to the log head (the writer's latest token
//!    minus their applied position) are sampled every 250 ms; then the time they take to catch up
//!    once the writer stops.
//!
//! Example: `lathe-replicas --dataset ../shared/eval/squad-a --replicas 3 --clients 8 --seconds 20`

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tonic::transport::Channel;

use lathe_tools::client::{connect, serve_command, upload_in_batches};
use lathe_tools::eval::{percentile, Dataset};
use lathe_tools::proto;
use lathe_tools::proto::lathe_client::LatheClient;

#[derive(Parser, Debug)]
#[command(
    name = "lathe-replicas",
    about = "Replication benchmark: bootstrap, reads, writes, lag"
)]
struct Args {
    /// Folder with docs.jsonl and queries.jsonl.
    #[arg(long)]
    dataset: PathBuf,
    /// The dataset's documents are uploaded this many times (copies k > 0 under new ids).
    #[arg(long, default_value_t = 1)]
    copies: usize,
    #[arg(long, default_value = "target/release/lathe")]
    lathe: PathBuf,
    /// nats-server binary (default: on the PATH, else /usr/sbin/nats-server).
    #[arg(long)]
    nats_server: Option<PathBuf>,
    #[arg(long, default_value = "./models")]
    models_dir: PathBuf,
    /// models.dense of every server.
    #[arg(long, default_value = "static")]
    dense: String,
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds per read run and of the write load.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Single-document upserts per write-latency run.
    #[arg(long, default_value_t = 200)]
    writes: usize,
    #[arg(long, default_value_t = 1024)]
    budget: u32,
    /// Measure the build and the bootstraps only (no reads, writes or lag).
    #[arg(long)]
    bootstrap_only: bool,
    /// Where the report (results.md) is written.
    #[arg(long, default_value = "bench-out/replicas")]
    out: PathBuf,
}

const COLLECTION: &str = "bench";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let work = tempfile::tempdir().context("a work folder")?;
    let dataset = Dataset::load(&args.dataset)?;
    let mut report = Report::default();
    let nats = NatsProcess::start(&nats_binary(&args)?, work.path())?;
    let spawner = Spawner {
        lathe: args.lathe.clone(),
        models_dir: args.models_dir.clone(),
        dense: args.dense.clone(),
    };
    let mut replicas = vec![
        spawner
            .replica(&work.path().join("r0"), Some(&nats.url))
            .await?,
    ];
    replicas[0].until_ready(Duration::from_secs(600)).await?;
    build(&args, &dataset, &mut replicas[0], &mut report).await?;
    report.stream = nats.stream_state().await?;
    for i in 1..args.replicas {
        let replica = spawner
            .replica(&work.path().join(format!("r{i}")), Some(&nats.url))
            .await?;
        let started = replica.spawned_at;
        replica.until_ready(Duration::from_secs(3600)).await?;
        report.bootstraps.push(started.elapsed());
        replicas.push(replica);
    }
    if !args.bootstrap_only {
        measure_load(
            &args,
            &dataset,
            &spawner,
            work.path(),
            &mut replicas,
            &mut report,
        )
        .await?;
    }
    let text = report.render(&args);
    println!("{text}");
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("results.md"), text)?;
    Ok(())
}

/// Reads over 1..=N replicas, write latencies, and the lag under sustained writes.
async fn measure_load(
    args: &Args,
    dataset: &Dataset,
    spawner: &Spawner,
    work: &Path,
    replicas: &mut [Replica],
    report: &mut Report,
) -> anyhow::Result<()> {
    // Shared by the runs, so that no run asks a (question, budget) pair an earlier one asked.
    let asked = Arc::new(AtomicU64::new(0));
    for n in 1..=replicas.len() {
        let addresses: Vec<String> = replicas[..n].iter().map(|r| r.address.clone()).collect();
        let load = ReadLoad {
            dataset,
            clients: args.clients,
            seconds: args.seconds,
            budget: args.budget,
            asked: Arc::clone(&asked),
        };
        report.reads.push((n, read_load(&addresses, load).await?));
    }
    write_latencies(args, spawner, work, &mut replicas[0], report).await?;
    report.lag = write_load(args, replicas).await?;
    Ok(())
}

fn nats_binary(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(path) = &args.nats_server {
        return Ok(path.clone());
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nats-server"))
        .find(|path| path.is_file())
        .context("no nats-server: scripts/install-nats-server.sh, or --nats-server")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

// ------------------------------------------------------------------------------------------------
// Processes

struct NatsProcess {
    child: Child,
    url: String,
}

impl NatsProcess {
    fn start(binary: &Path, dir: &Path) -> anyhow::Result<Self> {
        let port = free_port()?;
        let mut child = Command::new(binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.join("nats"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let log = spawn_log_reader(child.stderr.take().context("nats stderr")?);
        wait_for_line(&log, "Server is ready", Duration::from_secs(30))?;
        std::thread::spawn(move || while log.recv().is_ok() {});
        Ok(Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
        })
    }

    /// Messages and bytes of the log's stream.
    async fn stream_state(&self) -> anyhow::Result<(u64, u64)> {
        let client = async_nats::connect(&self.url).await?;
        let mut stream = async_nats::jetstream::new(client)
            .get_stream("LATHE")
            .await?;
        let info = stream.info().await?;
        Ok((info.state.messages, info.state.bytes))
    }
}

impl Drop for NatsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Spawner {
    lathe: PathBuf,
    models_dir: PathBuf,
    dense: String,
}

/// A `lathe serve` child: its gRPC and metrics addresses.
struct Replica {
    child: Child,
    address: String,
    metrics: String,
    client: LatheClient<Channel>,
    spawned_at: Instant,
}

impl Spawner {
    /// A replica of the log at `nats` (or a single node without it), once it serves gRPC.
    async fn replica(&self, data_dir: &Path, nats: Option<&str>) -> anyhow::Result<Replica> {
        let spawned_at = Instant::now();
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let mut command = serve_command(&self.lathe, &self.models_dir, data_dir, &self.dense);
        command
            .env("LATHE_LOG__FILTER", "warn,lathe=info")
            .env("LATHE_SERVER__METRICS_LISTEN", &metrics)
            .env("LATHE_SERVER__REQUEST_TIMEOUT_MS", "3600000");
        if let Some(url) = nats {
            command.env("LATHE_REPLICATION__NATS_URL", url);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", self.lathe.display()))?;
        let log = spawn_log_reader(child.stderr.take().context("lathe stderr")?);
        let line = tokio::task::spawn_blocking(move || {
            let line = wait_for_line(&log, "lathe serving", Duration::from_secs(600));
            std::thread::spawn(move || while log.recv().is_ok() {});
            line
        })
        .await??;
        let address = line
            .split("\"address\":\"")
            .nth(1)
            .map(|rest| rest.chars().take_while(|c| *c != '"').collect::<String>())
            .context("no address in the serving line")?;
        let client = connect(&address).await?;
        Ok(Replica {
            child,
            address,
            metrics,
            client,
            spawned_at,
        })
    }
}

impl Replica {
    async fn until_ready(&self, limit: Duration) -> anyhow::Result<()> {
        use tonic_health::pb::health_check_response::ServingStatus;
        let channel = Channel::from_shared(format!("http://{}", self.address))?
            .connect()
            .await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let deadline = Instant::now() + limit;
        loop {
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "lathe.v1.Lathe".into(),
                })
                .await?
                .into_inner()
                .status;
            if status == ServingStatus::Serving as i32 {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "not ready within {limit:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `name`'s value on the replica's /metrics.
    fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let mut stream = std::net::TcpStream::connect(&self.metrics)?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: lathe\r\n\r\n")?;
        let mut body = String::new();
        stream.read_to_string(&mut body)?;
        let prefix = format!("{name} ");
        body.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|value| value.trim().parse().ok())
            .with_context(|| format!("no {name} on /metrics"))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_log_reader(stderr: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (lines, log) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    log
}

fn wait_for_line(
    log: &mpsc::Receiver<String>,
    needle: &str,
    limit: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = log
            .recv_timeout(left)
            .with_context(|| format!("no `{needle}` in the log within {limit:?}"))?;
        if line.contains(needle) {
            return Ok(line);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The measurements

#[derive(Default)]
struct Report {
    documents: u64,
    sections: u64,
    text_bytes: u64,
    build: Duration,
    /// Messages and bytes of the stream after the build.
    stream: (u64, u64),
    bootstraps: Vec<Duration>,
    reads: Vec<(usize, LoadRun)>,
    /// (what, p50, p99) in ms.
    writes: Vec<(&'static str, f64, f64)>,
    lag: LagRun,
}

async fn create(client: &mut LatheClient<Channel>) -> anyhow::Result<()> {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: COLLECTION.into(),
            settings: None,
        })
        .await?;
    Ok(())
}

fn corpus(dataset: &Dataset, copies: usize) -> Vec<proto::Document> {
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

async fn build(
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
    let stats = writer
        .client
        .get_collection(proto::GetCollectionRequest {
            name: COLLECTION.into(),
        })
        .await?
        .into_inner()
        .stats
        .context("no stats")?;
    (report.documents, report.sections) = (stats.documents, stats.sections);
    Ok(())
}

#[derive(Default)]
struct LoadRun {
    requests: u64,
    errors: u64,
    seconds: f64,
    latencies_us: Vec<u64>,
}

/// One read run: `clients` clients asking the dataset's questions for `seconds`; `asked` counts
/// the requests of every run so far.
struct ReadLoad<'a> {
    dataset: &'a Dataset,
    clients: usize,
    seconds: u64,
    budget: u32,
    asked: Arc<AtomicU64>,
}

/// The clients of `load` over `addresses` (round-robin), every request a result-cache miss.
async fn read_load(addresses: &[String], load: ReadLoad<'_>) -> anyhow::Result<LoadRun> {
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
    client: &mut LatheClient<Channel>,
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
            })
            .await?;
        latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    Ok((percentile(&latencies, 50.0), percentile(&latencies, 99.0)))
}

async fn write_latencies(
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
struct LagRun {
    writes: u64,
    documents: u64,
    seconds: f64,
    /// Sampled lag seconds and distances (entries) of the followers.
    lags: Vec<f64>,
    distances: Vec<u64>,
    catch_up: Duration,
}

/// A writer without `wait` on replica 0 for `args.seconds`, the followers sampled meanwhile.
async fn write_load(args: &Args, replicas: &[Replica]) -> anyhow::Result<LagRun> {
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

// ------------------------------------------------------------------------------------------------
// The report

impl Report {
    fn render(&self, args: &Args) -> String {
        let mut out = String::new();
        let mb = |bytes: u64| bytes as f64 / 1e6;
        out += &format!(
            "Dataset {} ×{}: {} documents, {} sections, {:.1} MB of text; models.dense = {}.\n\n",
            args.dataset.display(),
            args.copies,
            self.documents,
            self.sections,
            mb(self.text_bytes),
            args.dense
        );
        out += &format!(
            "Build through replica 0: {:.1} s ({:.2} MB/s); the log holds {} messages, {:.1} MB.\n\n",
            self.build.as_secs_f64(),
            mb(self.text_bytes) / self.build.as_secs_f64(),
            self.stream.0,
            mb(self.stream.1)
        );
        out += "| new replica | bootstrap s | entries/s | sections/s | MB of log/s |\n|---:|---:|---:|---:|---:|\n";
        for (i, seconds) in self
            .bootstraps
            .iter()
            .map(Duration::as_secs_f64)
            .enumerate()
        {
            out += &format!(
                "| {} | {seconds:.2} | {:.0} | {:.0} | {:.2} |\n",
                i + 1,
                self.stream.0 as f64 / seconds,
                self.sections as f64 / seconds,
                mb(self.stream.1) / seconds
            );
        }
        if !self.reads.is_empty() {
            out += &self.render_load(args);
        }
        out
    }

    fn render_load(&self, args: &Args) -> String {
        let mut out = String::new();
        out += &format!(
            "\nReads, {} clients, cache misses, budget {}:\n\n| replicas | QPS | p50 ms | p99 ms | errors |\n|---:|---:|---:|---:|---:|\n",
            args.clients, args.budget
        );
        for (n, run) in &self.reads {
            let ms = |p| percentile(&run.latencies_us, p) as f64 / 1000.0;
            out += &format!(
                "| {n} | {:.1} | {:.1} | {:.1} | {} |\n",
                run.latencies_us.len() as f64 / run.seconds,
                ms(50.0),
                ms(99.0),
                run.errors
            );
        }
        out += &format!(
            "\nWrites, {} single-document upserts each:\n\n| write | p50 ms | p99 ms |\n|---|---:|---:|\n",
            args.writes
        );
        for (what, p50, p99) in &self.writes {
            out += &format!("| {what} | {p50:.2} | {p99:.2} |\n");
        }
        let lag = &self.lag;
        out += &format!(
            "\nSustained writes without wait on replica 0: {} upserts of 8 documents in {:.1} s ({:.0} documents/s). Followers sampled every 250 ms: lag p50 {:.2} s, p99 {:.2} s, max {:.2} s; distance to the log head p50 {}, p99 {}, max {} entries; caught up {:.2} s after the writer stopped.\n",
            lag.writes,
            lag.seconds,
            lag.documents as f64 / lag.seconds,
            percentile(&lag.lags, 50.0),
            percentile(&lag.lags, 99.0),
            lag.lags.last().copied().unwrap_or(0.0),
            percentile(&lag.distances, 50.0),
            percentile(&lag.distances, 99.0),
            lag.distances.last().copied().unwrap_or(0),
            lag.catch_up.as_secs_f64()
        );
        out
    }
}
