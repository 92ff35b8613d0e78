//! What idle collections cost: runs the real `lathe serve` binary, creates N collections of one
//! tiny document each, and reports while the server is idle its resident memory, threads
//! (`/proc/PID/status`), open descriptors (`/proc/PID/fd`) and memory maps; then stops it cleanly (SIGTERM),
//! starts it again and times how long until every collection answers `GetCollection`, and samples
//! the same figures after the restart. Restarts are repeated and reported as a median.
//!
//! Run (release binary first; lexical mode, as in issue 11, unless `--dense` says otherwise):
//! ```text
//! cargo build --release --locked
//! cargo bench --bench idle_collections -- --collections 1000 --binary target/release/lathe
//! ```
//! Options: `--collections N` (1000), `--binary PATH` (target/release/lathe), `--models-dir DIR`
//! (./models), `--dense off|static|minilm` (off), `--restarts R` (3), `--settle-seconds S` (15:
//! how long the server is left alone before the idle samples, longer than the writers' idle
//! close of 10 s by default), `--data-dir DIR` (a fresh temporary folder), `--env NAME=VALUE`
//! (repeatable: extra `LATHE_*` settings for the server), `--sample K` (after each restart,
//! check K collections spread over all of them instead of every one: each gets a Retrieve first,
//! timed, which opens it when it is closed, then `GetCollection`; the Retrieves' p50 and p99 are
//! reported), `--reuse` (the data dir holds the collections of an earlier run with `--data-dir`:
//! no creates, straight to the restarts), `--cold` (before each start, write back and drop the
//! page cache, `/proc/sys/vm/drop_caches`: needs root).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use lathe_tools::client::serve_command;
use tonic::transport::{Channel, Endpoint};

use lathe_tools::server_process::serving_address;

struct Options {
    collections: usize,
    binary: PathBuf,
    models_dir: PathBuf,
    dense: String,
    restarts: usize,
    settle: Duration,
    data_dir: Option<PathBuf>,
    env: Vec<(String, String)>,
    sample: Option<usize>,
    reuse: bool,
    cold: bool,
}

fn parse_options() -> Options {
    let mut options = Options {
        collections: 1000,
        binary: PathBuf::from("target/release/lathe"),
        models_dir: PathBuf::from("models"),
        dense: "off".to_string(),
        restarts: 3,
        settle: Duration::from_secs(15),
        data_dir: None,
        env: Vec::new(),
        sample: None,
        reuse: false,
        cold: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            "--collections" => options.collections = value().parse().expect("--collections N"),
            "--binary" => options.binary = PathBuf::from(value()),
            "--models-dir" => options.models_dir = PathBuf::from(value()),
            "--dense" => options.dense = value(),
            "--restarts" => options.restarts = value().parse().expect("--restarts R"),
            "--settle-seconds" => {
                options.settle = Duration::from_secs(value().parse().expect("--settle-seconds S"))
            }
            "--data-dir" => options.data_dir = Some(PathBuf::from(value())),
            "--sample" => options.sample = Some(value().parse().expect("--sample K")),
            "--reuse" => options.reuse = true,
            "--cold" => options.cold = true,
            "--env" => {
                let pair = value();
                let (name, value) = pair.split_once('=').expect("--env NAME=VALUE");
                options.env.push((name.to_string(), value.to_string()));
            }
            other => panic!("unknown option {other}"),
        }
    }
    options
}

struct Server {
    child: Child,
    address: String,
    /// From spawn to the "lathe serving" log line.
    started_in: Duration,
    log: mpsc::Receiver<String>,
}

fn start(options: &Options, data_dir: &Path) -> Server {
    let started = Instant::now();
    let mut child = serve_command(
        &options.binary,
        &options.models_dir,
        data_dir,
        &options.dense,
    )
    .env("LATHE_LOG__FILTER", "info")
    .envs(options.env.iter().map(|(n, v)| (n.as_str(), v.as_str())))
    .spawn()
    .unwrap_or_else(|e| panic!("cannot start {}: {e}", options.binary.display()));
    let stderr = child.stderr.take().expect("piped stderr");
    let (line_tx, log) = mpsc::channel();
    // Drains the log (a line per collection at start) so that the server never blocks on it.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });
    let address = loop {
        let line = log
            .recv_timeout(Duration::from_secs(600))
            .expect("the server did not log `lathe serving` within 10 minutes");
        if line.contains("lathe serving") {
            break serving_address(&line).expect("address in the serving line");
        }
    };
    Server {
        child,
        address,
        started_in: started.elapsed(),
        log,
    }
}

async fn connect(address: &str) -> LatheClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .expect("address")
        .connect()
        .await
        .expect("connect");
    LatheClient::new(channel)
}

/// Idle figures of process `pid`.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    rss_kib: u64,
    threads: u64,
    fds: u64,
    /// Memory mappings (`/proc/PID/maps` lines): tantivy maps each index file, and the kernel
    /// caps mappings per process (`vm.max_map_count`, 65530 by default).
    maps: u64,
}

fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| entries.count() as u64)
        .unwrap_or(0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|maps| maps.lines().count() as u64)
        .unwrap_or(0);
    Usage {
        rss_kib: field("VmRSS:"),
        threads: field("Threads:"),
        fds,
        maps,
    }
}

/// CPU seconds the process has used, user and system (`/proc/PID/stat`, fields 14 and 15).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // The command name, in parentheses, may hold spaces: count fields after its end.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("(comm)") + 2..]
        .split_whitespace()
        .collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    // SAFETY: sysconf reads a constant of the system.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Five samples one second apart after `settle`; the median of each figure.
fn idle_usage(pid: u32, settle: Duration) -> Usage {
    std::thread::sleep(settle);
    let mut samples = Vec::new();
    for _ in 0..5 {
        samples.push(usage(pid));
        std::thread::sleep(Duration::from_secs(1));
    }
    let median = |f: fn(&Usage) -> u64| {
        let mut values: Vec<u64> = samples.iter().map(f).collect();
        values.sort_unstable();
        values[values.len() / 2]
    };
    Usage {
        rss_kib: median(|u| u.rss_kib),
        threads: median(|u| u.threads),
        fds: median(|u| u.fds),
        maps: median(|u| u.maps),
    }
}

fn name_of(i: usize) -> String {
    format!("tenant-{i:05}")
}

/// Runs `work(client, i)` for every `i` in `0..collections`, 8 at a time.
async fn on_every_collection<Work, Done>(
    client: &LatheClient<Channel>,
    collections: usize,
    what: &str,
    work: Work,
) where
    Work: Fn(LatheClient<Channel>, usize) -> Done + Clone + Send + 'static,
    Done: std::future::Future<Output = ()> + Send,
{
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = client.clone();
        let next = std::sync::Arc::clone(&next);
        let work = work.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= collections {
                    return;
                }
                work(client.clone(), i).await;
            }
        }));
    }
    for task in tasks {
        task.await
            .unwrap_or_else(|error| panic!("{what} task: {error}"));
    }
}

/// Creates every collection with its one document, 8 at a time.
async fn create_all(client: &LatheClient<Channel>, collections: usize) {
    on_every_collection(client, collections, "create", |mut client, i| async move {
        let name = name_of(i);
        client
            .create_collection(proto::CreateCollectionRequest {
                name: name.clone(),
                settings: None,
            })
            .await
            .expect("create collection");
        client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: name,
                documents: vec![proto::Document {
                    id: "only".into(),
                    title: "A tiny document".into(),
                    text: format!("Tenant {i} keeps one short note about its invoices."),
                    ..Default::default()
                }],
                wait: true,
                write_id: String::new(),
            })
            .await
            .expect("upsert");
    })
    .await;
}

/// Asks every collection for its stats, 8 at a time; panics unless each has its document.
async fn check_all(client: &LatheClient<Channel>, collections: usize) {
    on_every_collection(client, collections, "check", |mut client, i| async move {
        check_document(&mut client, i).await
    })
    .await;
}

/// Panics unless collection `i` holds its one document.
async fn check_document(client: &mut LatheClient<Channel>, i: usize) {
    let stats = client
        .get_collection(proto::GetCollectionRequest { name: name_of(i) })
        .await
        .expect("get collection")
        .into_inner()
        .stats
        .expect("stats");
    assert_eq!(stats.documents, 1, "{} lost its document", name_of(i));
}

/// The first Retrieve to each of `sample` collections spread over all of them (one client, one
/// at a time, in an order that jumps about), then its stats; panics unless each has its
/// document. Returns the Retrieves' times.
async fn check_sample(
    client: &LatheClient<Channel>,
    collections: usize,
    sample: usize,
) -> Vec<Duration> {
    let step = (collections / sample.max(1)).max(1);
    let mut picked: Vec<usize> = (0..collections).step_by(step).take(sample).collect();
    // A fixed shuffle (multiplicative hash), so that runs compare.
    picked.sort_by_key(|&i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut client = client.clone();
    let mut times = Vec::with_capacity(picked.len());
    for i in picked {
        let started = Instant::now();
        let response = client
            .retrieve(proto::RetrieveRequest {
                collection: name_of(i),
                query: "invoices".into(),
                token_budget: 256,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|status| panic!("retrieve {}: {status}", name_of(i)))
            .into_inner();
        times.push(started.elapsed());
        assert_eq!(response.chunks.len(), 1, "{} answered no chunk", name_of(i));
        check_document(&mut client, i).await;
    }
    times
}

/// Writes back and drops the page cache, so that the next start reads every file from the disk.
fn drop_page_cache() {
    let synced = Command::new("sync").status().expect("sync");
    assert!(synced.success());
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .expect("writing /proc/sys/vm/drop_caches (--cold needs root)");
}

fn percentile(times: &[Duration], p: f64) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn stop(server: &mut Server) -> Duration {
    let started = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let exit = server.child.wait().expect("wait for lathe");
    assert!(exit.success(), "lathe exited with {exit}");
    // Leftover log lines are of no interest.
    while server.log.try_recv().is_ok() {}
    started.elapsed()
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn report(label: &str, usage: Usage) {
    println!(
        "{label}: RSS {:.0} MiB, {} threads, {} fds, {} memory maps",
        usage.rss_kib as f64 / 1024.0,
        usage.threads,
        usage.fds,
        usage.maps
    );
}

#[tokio::main]
async fn main() {
    let options = parse_options();
    let temporary = tempfile::tempdir().expect("temporary data dir");
    let data_dir = options
        .data_dir
        .clone()
        .unwrap_or_else(|| temporary.path().to_path_buf());
    println!(
        "idle_collections: {} collections of one tiny document, dense = {}, binary {}",
        options.collections,
        options.dense,
        options.binary.display()
    );

    let mut server = start(&options, &data_dir);
    let baseline = usage(server.child.id());
    report(
        if options.reuse {
            "the reused data dir, just started"
        } else {
            "empty server"
        },
        baseline,
    );
    if !options.reuse {
        let client = connect(&server.address).await;
        let created = Instant::now();
        let cpu_before = cpu_seconds(server.child.id());
        create_all(&client, options.collections).await;
        let creating = created.elapsed().as_secs_f64();
        let cpu = cpu_seconds(server.child.id()) - cpu_before;
        println!(
            "created {} collections in {creating:.1} s ({:.0} a second, each with its document); server CPU {:.2} ms a collection",
            options.collections,
            options.collections as f64 / creating,
            cpu * 1e3 / options.collections as f64
        );
        report("just after the writes", usage(server.child.id()));
        report(
            &format!("idle ({} s after the writes)", options.settle.as_secs()),
            idle_usage(server.child.id(), options.settle),
        );
    }

    let mut stops = Vec::new();
    let mut restarts = Vec::new();
    let mut serving = Vec::new();
    let mut after_restart = Usage::default();
    for round in 0..options.restarts {
        stops.push(stop(&mut server));
        if options.cold {
            drop_page_cache();
        }
        let started = Instant::now();
        server = start(&options, &data_dir);
        let client = connect(&server.address).await;
        match options.sample {
            None => check_all(&client, options.collections).await,
            Some(sample) => {
                let times = check_sample(&client, options.collections, sample).await;
                println!(
                    "restart {round}: the first Retrieve to {} collections: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                    times.len(),
                    percentile(&times, 0.5).as_secs_f64() * 1e3,
                    percentile(&times, 0.99).as_secs_f64() * 1e3,
                    percentile(&times, 1.0).as_secs_f64() * 1e3
                );
            }
        }
        restarts.push(started.elapsed());
        serving.push(server.started_in);
        println!(
            "restart {round}: stopped in {:.2} s, serving after {:.2} s, every (sampled) collection answered after {:.2} s",
            stops[round].as_secs_f64(),
            server.started_in.as_secs_f64(),
            restarts[round].as_secs_f64()
        );
        if round + 1 == options.restarts {
            after_restart = idle_usage(server.child.id(), Duration::from_secs(2));
        }
    }
    report("idle after a restart", after_restart);
    println!(
        "median over {} restarts: stop {:.2} s, start to serving {:.2} s, start to every collection answering {:.2} s",
        options.restarts,
        median(stops).as_secs_f64(),
        median(serving).as_secs_f64(),
        median(restarts).as_secs_f64()
    );
    stop(&mut server);
}
