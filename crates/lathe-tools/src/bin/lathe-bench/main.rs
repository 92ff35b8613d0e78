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

mod compare;
mod grpc;
mod report;
mod size;

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use lathe_tools::server_process::lathe_binary;

use crate::report::{replot, write_outputs};
use crate::size::{Bench, ServerCommand};
use lathe_tools::scale_corpus::load_corpus;

#[derive(Parser, Debug)]
#[command(
    name = "lathe-bench",
    about = "Scale benchmark: build, open, memory, latency and dense recall of a real lathe serve per corpus size"
)]
pub(crate) struct Args {
    /// A folder of .txt documents, or a docs.jsonl file.
    #[arg(long, default_value = "/tmp/lathe-debian-docs")]
    pub(crate) corpus: PathBuf,
    /// Collection sizes in sections (comma-separated), each built in a fresh data dir.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    pub(crate) sizes: Vec<usize>,
    /// The `lathe` binary to run; default: $LATHE_BIN, else the one beside this program.
    #[arg(long)]
    pub(crate) lathe: Option<PathBuf>,
    #[arg(long, default_value = "./models")]
    pub(crate) models_dir: PathBuf,
    /// The server's `models.dense`: static, minilm or off (no recall figure then).
    #[arg(long, default_value = "static")]
    pub(crate) dense: String,
    /// Queries of the 1-client run and of the 8-client run (each its own distinct texts).
    #[arg(long, default_value_t = 1000)]
    pub(crate) queries: usize,
    /// Concurrent clients of the second latency run.
    #[arg(long, default_value_t = 8)]
    pub(crate) clients: usize,
    #[arg(long, default_value_t = 1024)]
    pub(crate) budget: u32,
    /// Query vectors of the recall measurement.
    #[arg(long, default_value_t = 200)]
    pub(crate) recall_queries: usize,
    /// The dense search's candidate list (`dense.ef_search`) of the server and of the recall
    /// measurement; default: the server's default.
    #[arg(long)]
    pub(crate) ef_search: Option<usize>,
    /// Also measure recall@10 of one hnsw graph built over all the stored vectors with the
    /// index's graph parameters (printed beside the segmented index's): tells the data's
    /// difficulty apart from what segmenting costs.
    #[arg(long)]
    pub(crate) one_graph_recall: bool,
    /// M (`max_nb_connection`, 1..=256) of that one graph; default: the index's.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub(crate) one_graph_m: Option<usize>,
    /// `ef_construction` of that one graph (1..=4096); default: the index's.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub(crate) one_graph_ef_construction: Option<usize>,
    /// Level scale of that one graph (hnsw_rs's `modify_level_scale`, which takes 0.2 to 1.0:
    /// fewer upper layers below 1); default: the index's (1).
    #[arg(long)]
    pub(crate) one_graph_level_scale: Option<f64>,
    /// Candidate lists (`ef`) that one graph is searched with, each reported with its recall and
    /// mean search time; default: the index's `ef_search`.
    #[arg(long, value_delimiter = ',')]
    pub(crate) one_graph_ef: Vec<usize>,
    /// Search that one graph as the index searches a segment: through hnsw_rs's filtered search
    /// (here accepting every slot), which keeps walking after the unfiltered search would stop.
    #[arg(long)]
    pub(crate) one_graph_filtered: bool,
    /// Documents per upload call while building.
    #[arg(long, default_value_t = 256)]
    pub(crate) upload_documents: usize,
    /// The collection's `section_tokens` (how large its sections are cut); default: the
    /// server's (256).
    #[arg(long)]
    pub(crate) section_tokens: Option<u32>,
    /// Where results.md, results.csv and latency.svg go.
    #[arg(long, default_value = "bench-out")]
    pub(crate) out: PathBuf,
    /// Parent of the data dirs (one per size, removed afterwards unless --keep).
    #[arg(long)]
    pub(crate) work_dir: Option<PathBuf>,
    /// Keep each size's data dir.
    #[arg(long)]
    pub(crate) keep: bool,
    /// Reuse a size's data dir kept by an earlier run with the same --work-dir (and --keep):
    /// skip the build, take its figures from `size-<N>.build.json` beside the data dir, and
    /// measure the rest again. Implies --keep.
    #[arg(long)]
    pub(crate) reuse: bool,
    /// Measure nothing: write the table and plot of earlier runs' results.csv files (e.g. sizes
    /// run one at a time) to --out.
    #[arg(long, value_delimiter = ',')]
    pub(crate) from_csv: Vec<PathBuf>,
    /// Measure nothing: compare builds, each `LABEL=CSV` (an earlier run's results.csv; a label
    /// given again adds rows): writes compare.md and compare.svg (p50 against size, a line per
    /// build and client count) to --out.
    #[arg(long, value_parser = compare::parse_compare)]
    pub(crate) compare: Vec<(String, PathBuf)>,
}

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

fn run(args: Args) -> anyhow::Result<()> {
    if !args.from_csv.is_empty() {
        return replot(&args);
    }
    if !args.compare.is_empty() {
        return compare::compare(&args);
    }
    validate(&args)?;
    let corpus = load_corpus(&args.corpus)?;
    let binary = match &args.lathe {
        Some(binary) => binary.clone(),
        None => lathe_binary().context("no --lathe given")?,
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
