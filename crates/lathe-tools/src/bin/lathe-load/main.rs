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

mod clients;
mod report;
mod run;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use clap::Parser;

use lathe_tools::client::{connect, unique_collection_name, upload_in_batches};
use lathe_tools::eval::Dataset;
use lathe_tools::proc_status::resident;
use lathe_tools::proto;
use lathe_tools::server_process::TargetServer;

use crate::clients::{distinct_questions, requested_top_k, Mode};
use crate::report::{print_header, print_row, print_stages};
use crate::run::{run, LoadTarget, RunShape};

#[derive(Parser, Debug)]
#[command(
    name = "lathe-load",
    about = "Load generator for a Lathe server (loopback gRPC)"
)]
pub(crate) struct Args {
    /// Folder with docs.jsonl and queries.jsonl.
    pub(crate) dataset: PathBuf,
    /// A running server (loopback only); without it one is started in this process.
    #[arg(long)]
    pub(crate) addr: Option<String>,
    #[arg(long, default_value = "./models")]
    pub(crate) models_dir: PathBuf,
    /// CPU pool threads of the server it starts (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub(crate) cpu_threads: usize,
    /// Concurrent clients; several values (comma-separated) run one after another.
    #[arg(long, value_delimiter = ',', default_value = "8")]
    pub(crate) clients: Vec<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 20)]
    pub(crate) seconds: u64,
    /// miss, hit, or both (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "miss,hit")]
    pub(crate) mode: Vec<String>,
    /// Run a concurrent writer that upserts documents during each run.
    #[arg(long)]
    pub(crate) writer: bool,
    #[arg(long, default_value_t = 512)]
    pub(crate) budget: u32,
    /// Sections per request; 0 leaves `top_k` unset, so the server takes its depth from the budget.
    #[arg(long, default_value_t = 8)]
    pub(crate) top_k: u32,
    /// Result order of every request: score, or position (grouped by document, each chunk
    /// under its heading path).
    #[arg(long, default_value = "score", value_parser = ["score", "position"])]
    pub(crate) order: String,
    /// Requests a second per client, sent on a fixed schedule whatever the answers' latency
    /// (an open loop: a late answer delays none of the later requests, and each latency counts
    /// from when its request was due); 0 (the default): each client sends its next request as
    /// soon as the last is answered.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) rate: f64,
    /// Query this existing collection of the server given with `--addr` instead of ingesting the
    /// dataset into a new one (its questions are still read from the dataset); it is kept.
    #[arg(long)]
    pub(crate) collection: Option<String>,
    /// First run `miss` requests from one client for this many seconds, untimed, from the last
    /// question back: the server and its section cache warm up, and the timed runs (from the
    /// first question on) still ask questions it has not seen, so neither their answers nor their
    /// query vectors are cached.
    #[arg(long, default_value_t = 0)]
    pub(crate) warm_up_seconds: u64,
    /// Also print the server's per-stage timings (RetrieveResponse.timings): p50 and p99 of each
    /// stage over the run's answers.
    #[arg(long)]
    pub(crate) stages: bool,
    /// Questions repeated in `hit` mode.
    #[arg(long, default_value_t = 32)]
    pub(crate) hot_set: usize,
    /// Upper bound on requests per run.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) max_requests: u64,
    /// Print an interval line (latency, writes, RSS) every this many seconds; 0: off.
    #[arg(long, default_value_t = 0)]
    pub(crate) sample_every: u64,
    /// With `--writer`: first a read-only run of this many seconds on the same collection, the
    /// baseline a soak's latency is compared with; 0: none.
    #[arg(long, default_value_t = 0)]
    pub(crate) read_only_first: u64,
}

fn is_loopback(address: &str) -> bool {
    let host = address
        .trim_start_matches("http://")
        .rsplit_once(':')
        .map_or(address, |(host, _)| host);
    matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1")
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
    client: &mut lathe_tools::client::Client,
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

/// The collection the runs query, and what the preamble says it holds: the one `--collection`
/// names, or a new one the dataset is ingested into.
async fn prepare_collection(
    client: &mut lathe_tools::client::Client,
    args: &Args,
    dataset: &Dataset,
) -> anyhow::Result<(Arc<str>, String)> {
    Ok(match &args.collection {
        Some(existing) => (
            Arc::from(existing.as_str()),
            format!("collection {existing}"),
        ),
        None => {
            let collection: Arc<str> = Arc::from(unique_collection_name("load"));
            let ingested = ingest_dataset(client, &collection, dataset).await?;
            let contents = format!(
                "{} documents ({} sections)",
                ingested.documents, ingested.sections
            );
            (collection, contents)
        }
    })
}

/// The untimed warm-up, if one is asked for, then the runs of the table, each printed as it ends.
async fn run_table(target: &LoadTarget, shapes: Vec<RunShape>) -> anyhow::Result<()> {
    if target.args.warm_up_seconds > 0 {
        let warm_up = RunShape {
            mode: Mode::WarmUp,
            clients: 1,
            writer: false,
            seconds: target.args.warm_up_seconds,
        };
        let report = run(target, warm_up).await?;
        println!(
            "warm-up: {} requests in {:.1} s, not reported\n",
            report.requests, report.seconds
        );
    }
    if target.args.sample_every == 0 {
        print_header();
    }
    for (run_index, shape) in shapes.into_iter().enumerate() {
        let report = run(target, shape).await?;
        if target.args.sample_every > 0 || (target.args.stages && run_index > 0) {
            println!();
            print_header();
        }
        print_row(&report);
        if target.args.stages {
            print_stages(&report);
        }
    }
    Ok(())
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
    let (collection, contents) = prepare_collection(&mut client, &args, &dataset).await?;
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
    if let Ok(memory) = resident(server.pid()) {
        println!("resident memory after ingest: {:.0} MiB\n", memory.total);
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
    run_table(&target, shapes).await?;
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
