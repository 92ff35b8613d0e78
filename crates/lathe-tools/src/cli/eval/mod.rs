//! `lathe eval <dataset-dir>`: retrieval quality and latency through the real gRPC API.
//!
//! The dataset's documents are ingested into a fresh collection of a running server (`--addr`) or
//! of one started in this process on a loopback port; every query is then run at each budget with
//! each chunking strategy (and, with `--with-baselines`, against LangChain-style pre-chunked
//! collections), scored against the gold answer spans, and reported as a Markdown table, a
//! recall-vs-budget SVG and a run file with the returned spans.

mod collections;
mod measure;
mod output;
mod progress;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rand::SeedableRng;

use crate::client::strategy_from_name;
use crate::eval::Dataset;
use crate::proto;
use crate::server_process::TargetServer;

use collections::ingest_collections;
use measure::measure;
use output::{create_run_file, write_report, ReportInputs};

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Folder with docs.jsonl and queries.jsonl (the layout of shared/eval/squad-a).
    pub dataset: PathBuf,
    /// A running server; without it a server is started in this process on a loopback port.
    #[arg(long)]
    pub addr: Option<String>,
    /// Models folder: the MiniLM tokenizer recounts returned tokens, and the server it starts
    /// loads its models from here.
    #[arg(long, default_value = "./models")]
    pub models_dir: PathBuf,
    /// CPU pool threads of the server it starts (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub cpu_threads: usize,
    /// Token budgets, comma-separated (default: the powers of two from 128 to 32768).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "128,256,512,1024,2048,4096,8192,16384,32768"
    )]
    pub budgets: Vec<u32>,
    /// Leave out the system "defaults": requests that hold only the query and the budget, so the
    /// server chooses depth, chunking and order as it does for a caller who sets nothing.
    #[arg(long)]
    pub no_defaults: bool,
    /// Lathe chunking strategies, comma-separated (fixed, sentence, recursive, structure, auto,
    /// semantic); `--strategies ""` runs none, e.g. to measure only the defaults.
    #[arg(long, value_delimiter = ',', default_value = "sentence,fixed")]
    pub strategies: Vec<String>,
    /// Largest chunk in tokens; several values (comma-separated) run each strategy at each size.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub max_tokens: Vec<u32>,
    /// Overlap between neighbouring chunks, in tokens.
    #[arg(long, default_value_t = 0)]
    pub overlap: u32,
    /// Sections retrieved and re-chunked per query.
    #[arg(long, default_value_t = 8)]
    pub top_k: u32,
    /// Pieces retrieved per query for the baselines (default: --top-k). A baseline returns at
    /// most this many pieces, so a large budget needs a larger value to be filled.
    #[arg(long)]
    pub baseline_top_k: Option<u32>,
    /// Section size of Lathe's collection in tokens (default: the server's, 256): how large the
    /// sections cut at ingest are, which the coarse stage ranks.
    #[arg(long)]
    pub section_tokens: Option<u32>,
    /// Ingest documents as plain text (Lathe cuts sections) or with the dataset's sections.
    #[arg(long = "as", value_parser = ["plain", "sections"], default_value = "plain")]
    pub ingest_as: String,
    /// Also run the default baselines (recursive-400-0,recursive-1000-200).
    #[arg(long)]
    pub with_baselines: bool,
    /// Baselines `recursive-<chunk_size>-<chunk_overlap>` (characters), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub baselines: Option<Vec<String>>,
    /// Evaluate a sample of this many queries.
    #[arg(long)]
    pub max_queries: Option<usize>,
    /// Seed of the query sample.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Seconds between the progress lines of an ingest when stderr is not a terminal (on a
    /// terminal: a progress bar).
    #[arg(long, default_value_t = 5.0)]
    pub progress_seconds: f64,
    /// Retrieve requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Output folder (results.md, budgets.svg: recall, fill and latency by budget, run.jsonl).
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    /// Run file (default: <out>/run.jsonl).
    #[arg(long)]
    pub run_file: Option<PathBuf>,
    /// Keep the collections on a server given with --addr (they are deleted by default).
    #[arg(long)]
    pub keep_collections: bool,
    /// Name the collections `<RUN_ID>-lathe` and `<RUN_ID>-<baseline>` on the server given with
    /// --addr, use those that exist as they are (filled by an earlier run with the same id and
    /// dataset) and keep them all: a second run, e.g. against a rebuilt server on the same data
    /// dir, skips the ingest.
    #[arg(long, value_name = "RUN_ID")]
    pub reuse: Option<String>,
    // How to reach the server given with --addr (a server started here is plaintext and open).
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
}

/// The system of requests that hold only the query and the budget.
const DEFAULTS_LABEL: &str = "defaults";

enum SystemKind {
    /// Only the query and the budget: everything else is the server's choice.
    Defaults,
    Lathe {
        strategy: proto::ChunkStrategy,
        max_tokens: u32,
    },
    /// An index into the baselines.
    Baseline(usize),
}

struct System {
    /// Name written to the run file's `strategy` and the table's column.
    label: String,
    kind: SystemKind,
}

/// What the evaluation reads before it talks to a server.
struct EvalInputs {
    dataset: Dataset,
    /// The queries asked (all, or a seeded sample), in dataset order.
    query_indices: Vec<usize>,
    /// The MiniLM tokenizer that recounts returned tokens.
    recount_tokenizer: tokenizers::Tokenizer,
    /// Code point → byte offset table of each dataset document.
    char_bytes: Vec<Vec<usize>>,
}

/// Code point → byte offset tables, so returned spans can be checked against the text.
fn char_to_byte(text: &str) -> Vec<usize> {
    text.char_indices()
        .map(|(b, _)| b)
        .chain(std::iter::once(text.len()))
        .collect()
}

fn load_recount_tokenizer(models_dir: &Path) -> anyhow::Result<tokenizers::Tokenizer> {
    let path = models_dir.join("minilm/tokenizer.json");
    let mut tokenizer = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| anyhow::anyhow!("loading {}: {e}", path.display()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| anyhow::anyhow!("disabling truncation: {e}"))?;
    Ok(tokenizer)
}

fn sample_queries(dataset: &Dataset, max_queries: Option<usize>, seed: u64) -> Vec<usize> {
    let total = dataset.queries.len();
    match max_queries {
        Some(n) if n < total => {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut picked = rand::seq::index::sample(&mut rng, total, n).into_vec();
            picked.sort_unstable();
            picked
        }
        _ => (0..total).collect(),
    }
}

pub async fn eval(args: EvalArgs) -> anyhow::Result<()> {
    if args.budgets.is_empty() || args.budgets.contains(&0) {
        anyhow::bail!("--budgets needs one or more positive budgets");
    }
    if args.reuse.is_some() && args.addr.is_none() {
        anyhow::bail!("--reuse names collections of the server given with --addr");
    }
    let inputs = read_inputs(&args)?;
    let lathe_systems = lathe_systems(&args)?;
    let target =
        TargetServer::given_or_started(args.addr.as_deref(), &args.models_dir, args.cpu_threads)?;
    let connect_args = if target.is_started_here() {
        crate::client::ConnectArgs::default()
    } else {
        args.connect.clone()
    };
    let mut client = connect_args.connect(&target.address).await?;
    let collections = ingest_collections(&mut client, &args, &inputs, lathe_systems).await?;
    if collections.systems.is_empty() {
        anyhow::bail!("nothing to evaluate: give --strategies or --baselines");
    }
    let (run_path, mut run_file) = create_run_file(&args)?;
    let measurements = measure(&client, &args, &inputs, &collections, &mut run_file).await?;
    run_file.flush().context("writing the run file")?;
    let server_label = if target.is_started_here() {
        "started by eval (loopback)"
    } else {
        target.address.as_str()
    };
    let report_parts = ReportInputs {
        args: &args,
        inputs: &inputs,
        collections: &collections,
        measurements: &measurements,
        server_label,
    };
    write_report(&report_parts, &run_path)?;
    if !target.is_started_here() && !args.keep_collections && args.reuse.is_none() {
        for collection in collections.created {
            let _ = client
                .delete_collection(proto::DeleteCollectionRequest { name: collection })
                .await;
        }
    }
    target.stop()
}

fn read_inputs(args: &EvalArgs) -> anyhow::Result<EvalInputs> {
    let dataset = Dataset::load(&args.dataset)
        .with_context(|| format!("loading the dataset in {}", args.dataset.display()))?;
    let query_indices = sample_queries(&dataset, args.max_queries, args.seed);
    let recount_tokenizer = load_recount_tokenizer(&args.models_dir)?;
    let char_bytes = dataset
        .documents
        .iter()
        .map(|d| char_to_byte(&d.text))
        .collect();
    Ok(EvalInputs {
        dataset,
        query_indices,
        recount_tokenizer,
        char_bytes,
    })
}

/// The server's defaults (unless `--no-defaults`), then each strategy at each `--max-tokens`.
fn lathe_systems(args: &EvalArgs) -> anyhow::Result<Vec<System>> {
    let mut systems = Vec::new();
    if !args.no_defaults {
        systems.push(System {
            label: DEFAULTS_LABEL.to_string(),
            kind: SystemKind::Defaults,
        });
    }
    for &max_tokens in &args.max_tokens {
        for name in args.strategies.iter().filter(|name| !name.is_empty()) {
            systems.push(System {
                label: format!("{name}/{max_tokens}"),
                kind: SystemKind::Lathe {
                    strategy: strategy_from_name(name)?,
                    max_tokens,
                },
            });
        }
    }
    Ok(systems)
}
