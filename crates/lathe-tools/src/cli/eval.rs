//! `lathe eval <dataset-dir>`: retrieval quality and latency through the real gRPC API.
//!
//! The dataset's documents are ingested into a fresh collection of a running server (`--addr`) or
//! of one started in this process on a loopback port; every query is then run at each budget with
//! each chunking strategy (and, with `--with-baselines`, against LangChain-style pre-chunked
//! collections), scored against the gold answer spans, and reported as a Markdown table, a
//! recall-vs-budget SVG and a run file with the returned spans.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use tonic::transport::Channel;

use crate::client::{connect, strategy_from_name, unique_collection_name, upload_in_batches};
use crate::eval::report::{self, Cell};
use crate::eval::splitter::RecursiveCharacterSplitter;
use crate::eval::{distinct_spans, score_query, summarize, Dataset, QueryOutcome, ReturnedChunk};
use crate::proto;
use crate::proto::lathe_client::LatheClient;
use crate::server_process::TargetServer;

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
    /// Retrieve requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Output folder (results.md, recall.svg, run.jsonl).
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
}

/// The system of requests that hold only the query and the budget.
const DEFAULTS_LABEL: &str = "defaults";
const DEFAULT_BASELINES: [&str; 2] = ["recursive-400-0", "recursive-1000-200"];
/// `limits.max_chunk_tokens` of the default configuration: a baseline piece is one chunk.
const WHOLE_SECTION_TOKENS: u32 = 8_192;
const UPLOAD_BATCH: usize = 256;

/// A pre-chunked baseline: each piece is its own document (pieces overlap, and caller-given
/// sections of one document may not), indexed as one caller-given section.
struct Baseline {
    name: String,
    chunk_size: usize,
    chunk_overlap: usize,
    collection: String,
    /// Piece document id → where the piece lies in the dataset.
    pieces: HashMap<String, PiecePlace>,
}

/// Where a baseline piece lies: its dataset document and its code points there.
#[derive(Clone, Copy)]
struct PiecePlace {
    document_index: usize,
    first_char: u64,
    char_count: u64,
}

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

/// Checks of the returned spans, kept per system.
#[derive(Default, Clone, Copy)]
struct SpanChecks {
    chunks: u64,
    /// Chunks whose text differs from the document text at the returned code points.
    offset_mismatches: u64,
    /// Baselines: chunks that are a whole piece.
    whole_pieces: u64,
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

/// The collections of one evaluation and the systems measured on them.
struct EvalCollections {
    lathe_collection: String,
    /// Every collection created (deleted at the end on a given server).
    created: Vec<String>,
    baselines: Vec<Baseline>,
    systems: Vec<System>,
    /// Lines of the report that say what was ingested.
    notes: Vec<String>,
}

/// What the timed part produced.
struct Measurements {
    cells: Vec<Cell>,
    checks: HashMap<String, SpanChecks>,
    retrieves: u64,
    elapsed: Duration,
}

/// One query's answer, scored.
struct ScoredQuery {
    query_index: usize,
    outcome: QueryOutcome,
    chunks: Vec<ReturnedChunk>,
}

fn parse_baseline(name: &str) -> anyhow::Result<(usize, usize)> {
    let mut parts = name.split('-');
    let (Some("recursive"), Some(size), Some(overlap), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        anyhow::bail!("baseline `{name}`: expected recursive-<chunk_size>-<chunk_overlap>");
    };
    let size: usize = size
        .parse()
        .with_context(|| format!("baseline `{name}`: chunk size"))?;
    let overlap: usize = overlap
        .parse()
        .with_context(|| format!("baseline `{name}`: chunk overlap"))?;
    if size == 0 || overlap >= size {
        anyhow::bail!("baseline `{name}`: need 0 <= chunk_overlap < chunk_size");
    }
    Ok((size, overlap))
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

async fn create_collection(
    client: &mut LatheClient<Channel>,
    name: &str,
    section_tokens: Option<u32>,
) -> anyhow::Result<()> {
    let settings = section_tokens.map(|tokens| proto::CollectionSettings {
        section_tokens: Some(tokens),
        ..Default::default()
    });
    client
        .create_collection(proto::CreateCollectionRequest {
            name: name.to_string(),
            settings,
        })
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "creating collection {name}: {:?}: {}",
                s.code(),
                s.message()
            )
        })?;
    Ok(())
}

/// Streams `documents` in batches; returns (documents, sections, seconds).
async fn upload(
    client: &mut LatheClient<Channel>,
    collection: &str,
    documents: Vec<proto::Document>,
) -> anyhow::Result<(u32, u32, f64)> {
    let started = Instant::now();
    let response = upload_in_batches(client, collection, documents, UPLOAD_BATCH)
        .await
        .map_err(|s| {
            anyhow::anyhow!("uploading to {collection}: {:?}: {}", s.code(), s.message())
        })?;
    Ok((
        response.documents,
        response.sections,
        started.elapsed().as_secs_f64(),
    ))
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
    let mut client = connect(&target.address).await?;
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

fn baseline_names(args: &EvalArgs) -> Vec<String> {
    match (&args.baselines, args.with_baselines) {
        (Some(names), _) => names.clone(),
        (None, true) => DEFAULT_BASELINES.iter().map(|s| s.to_string()).collect(),
        (None, false) => Vec::new(),
    }
}

/// Creates and fills Lathe's collection (when a Lathe system is measured), then one collection
/// per baseline; the baselines join the systems after Lathe's.
async fn ingest_collections(
    client: &mut LatheClient<Channel>,
    args: &EvalArgs,
    inputs: &EvalInputs,
    lathe_systems: Vec<System>,
) -> anyhow::Result<EvalCollections> {
    let run_id = args
        .reuse
        .clone()
        .unwrap_or_else(|| unique_collection_name("eval"));
    let mut collections = EvalCollections {
        // The section size in the name: a reused collection was cut with the asked one.
        lathe_collection: match args.section_tokens {
            Some(tokens) => format!("{run_id}-lathe-s{tokens}"),
            None => format!("{run_id}-lathe"),
        },
        created: Vec::new(),
        baselines: Vec::new(),
        systems: lathe_systems,
        notes: Vec::new(),
    };
    if !collections.systems.is_empty() {
        let collection = collections.lathe_collection.clone();
        let documents = inputs.dataset.documents.len();
        if reused(client, args, &collection, documents).await? {
            collections
                .notes
                .push(format!("Lathe collection: {collection}, reused as it was."));
        } else {
            create_collection(client, &collection, args.section_tokens).await?;
            collections.created.push(collection.clone());
            let with_sections = args.ingest_as == "sections";
            let documents = inputs.dataset.proto_documents(with_sections);
            let (docs, sections, seconds) = upload(client, &collection, documents).await?;
            collections.notes.push(format!(
                "Lathe collection: {docs} documents ingested as {} → {sections} sections in {seconds:.2} s.",
                args.ingest_as
            ));
        }
    }
    for name in baseline_names(args) {
        let collection = format!("{run_id}-{name}");
        let pieces = baseline_piece_count(inputs, &name)?;
        let upload_pieces = !reused(client, args, &collection, pieces).await?;
        if upload_pieces {
            create_collection(client, &collection, None).await?;
            collections.created.push(collection.clone());
        }
        let baseline = ingest_baseline(client, inputs, &name, collection, upload_pieces).await?;
        collections.notes.push(baseline.1);
        collections.systems.push(System {
            label: name,
            kind: SystemKind::Baseline(collections.baselines.len()),
        });
        collections.baselines.push(baseline.0);
    }
    Ok(collections)
}

/// With `--reuse`, whether `collection` is already on the server (then it is used as it is); an
/// existing one must hold `documents` documents, else an earlier run did not finish filling it.
async fn reused(
    client: &mut LatheClient<Channel>,
    args: &EvalArgs,
    collection: &str,
    documents: usize,
) -> anyhow::Result<bool> {
    if args.reuse.is_none() {
        return Ok(false);
    }
    let request = proto::GetCollectionRequest {
        name: collection.to_string(),
    };
    match client.get_collection(request).await {
        Ok(info) => {
            let held = info.into_inner().stats.map_or(0, |stats| stats.documents);
            if held != documents as u64 {
                anyhow::bail!(
                    "collection {collection} holds {held} documents, not the {documents} of this dataset: delete it or use another --reuse id"
                );
            }
            Ok(true)
        }
        Err(status) if status.code() == tonic::Code::NotFound => Ok(false),
        Err(status) => Err(anyhow::anyhow!(
            "looking up collection {collection}: {:?}: {}",
            status.code(),
            status.message()
        )),
    }
}

/// How many pieces the baseline `name` cuts the dataset into.
fn baseline_piece_count(inputs: &EvalInputs, name: &str) -> anyhow::Result<usize> {
    let (chunk_size, chunk_overlap) = parse_baseline(name)?;
    let splitter = RecursiveCharacterSplitter::new(chunk_size, chunk_overlap);
    Ok(inputs
        .dataset
        .documents
        .iter()
        .map(|document| splitter.split_chars(&document.text).len())
        .sum())
}

/// Splits every document into the baseline's pieces and, with `upload_pieces`, uploads each piece
/// as a document of one caller-given section; returns the baseline and its note for the report.
async fn ingest_baseline(
    client: &mut LatheClient<Channel>,
    inputs: &EvalInputs,
    name: &str,
    collection: String,
    upload_pieces: bool,
) -> anyhow::Result<(Baseline, String)> {
    let (chunk_size, chunk_overlap) = parse_baseline(name)?;
    let splitter = RecursiveCharacterSplitter::new(chunk_size, chunk_overlap);
    let mut pieces = HashMap::new();
    let mut documents = Vec::new();
    for (document_index, document) in inputs.dataset.documents.iter().enumerate() {
        let bytes = &inputs.char_bytes[document_index];
        for (ordinal, range) in splitter.split_chars(&document.text).into_iter().enumerate() {
            let text = &document.text[bytes[range.start as usize]..bytes[range.end as usize]];
            let id = format!("{}~{ordinal}", document.doc_id);
            let char_count = range.end - range.start;
            let place = PiecePlace {
                document_index,
                first_char: range.start,
                char_count,
            };
            pieces.insert(id.clone(), place);
            documents.push(proto::Document {
                id,
                title: document.title.clone(),
                text: text.to_string(),
                format: proto::DocumentFormat::Plain as i32,
                metadata: HashMap::new(),
                sections: vec![proto::SectionBoundary {
                    start: 0,
                    end: char_count,
                    title: String::new(),
                }],
            });
        }
    }
    let piece_count = documents.len();
    let indexed = if upload_pieces {
        let (_, sections, seconds) = upload(client, &collection, documents).await?;
        format!("indexed as {sections} caller-given sections in {seconds:.2} s")
    } else {
        format!("in {collection}, reused as it was")
    };
    let note = format!(
        "Baseline {name}: {piece_count} pieces (LangChain RecursiveCharacterTextSplitter semantics, chunk_size {chunk_size}, chunk_overlap {chunk_overlap} characters) {indexed}."
    );
    let baseline = Baseline {
        name: name.to_string(),
        chunk_size,
        chunk_overlap,
        collection,
        pieces,
    };
    Ok((baseline, note))
}

fn create_run_file(
    args: &EvalArgs,
) -> anyhow::Result<(PathBuf, std::io::BufWriter<std::fs::File>)> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let run_path = args
        .run_file
        .clone()
        .unwrap_or_else(|| args.out.join("run.jsonl"));
    let run_file = std::io::BufWriter::new(
        std::fs::File::create(&run_path)
            .with_context(|| format!("creating {}", run_path.display()))?,
    );
    Ok((run_path, run_file))
}

fn progress_bar(total: u64) -> ProgressBar {
    let progress = ProgressBar::new(total);
    progress.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40.cyan/blue}] {pos}/{len} {per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    progress
}

/// Runs every query at each budget for every system, scores the answers and writes them to the
/// run file.
async fn measure(
    client: &LatheClient<Channel>,
    args: &EvalArgs,
    inputs: &EvalInputs,
    collections: &EvalCollections,
    run_file: &mut impl std::io::Write,
) -> anyhow::Result<Measurements> {
    let retrieves =
        (collections.systems.len() * args.budgets.len() * inputs.query_indices.len()) as u64;
    let progress = progress_bar(retrieves);
    let mut cells = Vec::new();
    let mut checks: HashMap<String, SpanChecks> = HashMap::new();
    let started = Instant::now();
    for system in &collections.systems {
        for &budget in &args.budgets {
            progress.set_message(format!("{} @ {budget}", system.label));
            let cell = CellRun {
                args,
                inputs,
                collections,
                system,
                budget,
                progress: &progress,
            };
            let check = checks.entry(system.label.clone()).or_default();
            let results = cell.run(client, check).await?;
            write_run_lines(run_file, &inputs.dataset, budget, &system.label, &results)?;
            let outcomes: Vec<QueryOutcome> = results.into_iter().map(|r| r.outcome).collect();
            cells.push(Cell {
                budget,
                system: system.label.clone(),
                summary: summarize(&outcomes),
            });
        }
    }
    progress.finish_and_clear();
    Ok(Measurements {
        cells,
        checks,
        retrieves,
        elapsed: started.elapsed(),
    })
}

/// One cell of the table: one system at one budget, every sampled query.
struct CellRun<'a> {
    args: &'a EvalArgs,
    inputs: &'a EvalInputs,
    collections: &'a EvalCollections,
    system: &'a System,
    budget: u32,
    progress: &'a ProgressBar,
}

impl CellRun<'_> {
    fn baseline(&self) -> Option<&Baseline> {
        match self.system.kind {
            SystemKind::Baseline(i) => Some(&self.collections.baselines[i]),
            SystemKind::Lathe { .. } | SystemKind::Defaults => None,
        }
    }

    /// The collection, chunking options and top_k this system asks with (none: the server's).
    fn request_parts(&self) -> (String, Option<proto::ChunkingOptions>, Option<u32>) {
        let lathe_collection = self.collections.lathe_collection.clone();
        match (&self.system.kind, self.baseline()) {
            (SystemKind::Defaults, _) => (lathe_collection, None, None),
            (
                SystemKind::Lathe {
                    strategy,
                    max_tokens,
                },
                _,
            ) => (
                lathe_collection,
                Some(proto::ChunkingOptions {
                    strategy: *strategy as i32,
                    max_tokens: Some(*max_tokens),
                    overlap_tokens: Some(self.args.overlap),
                    unit: proto::ChunkUnit::Tokens as i32,
                    separators: Vec::new(),
                    ..Default::default()
                }),
                Some(self.args.top_k),
            ),
            // One chunk per piece: no re-chunking, the server only packs whole pieces.
            (SystemKind::Baseline(_), baseline) => (
                baseline.map(|b| b.collection.clone()).unwrap_or_default(),
                Some(proto::ChunkingOptions {
                    strategy: proto::ChunkStrategy::Fixed as i32,
                    max_tokens: Some(WHOLE_SECTION_TOKENS),
                    overlap_tokens: Some(0),
                    unit: proto::ChunkUnit::Tokens as i32,
                    separators: Vec::new(),
                    ..Default::default()
                }),
                Some(self.args.baseline_top_k.unwrap_or(self.args.top_k)),
            ),
        }
    }

    /// Asks every query with up to `--concurrency` in flight; returns them scored, in query order.
    async fn run(
        &self,
        client: &LatheClient<Channel>,
        check: &mut SpanChecks,
    ) -> anyhow::Result<Vec<ScoredQuery>> {
        let (collection, chunking, top_k) = self.request_parts();
        // Only the defaults leave the server to choose MMR per query; the tuned systems and the
        // baselines rank by score alone, as the configurations they stand for do.
        let diversity = match self.system.kind {
            SystemKind::Defaults => None,
            SystemKind::Lathe { .. } | SystemKind::Baseline(_) => Some(0.0),
        };
        let dataset = &self.inputs.dataset;
        let requests = self
            .inputs
            .query_indices
            .iter()
            .copied()
            .map(|query_index| {
                let mut client = client.clone();
                let request = proto::RetrieveRequest {
                    collection: collection.clone(),
                    query: dataset.queries[query_index].question.clone(),
                    top_k,
                    token_budget: self.budget,
                    chunking: chunking.clone(),
                    filter: None,
                    order: proto::ResultOrder::Score as i32,
                    min_score: None,
                    max_chunks_per_document: None,
                    diversity,
                    consistency_token: 0,
                };
                async move {
                    let sent = Instant::now();
                    let response = client.retrieve(request).await;
                    (query_index, sent.elapsed(), response)
                }
            });
        let mut responses =
            futures::stream::iter(requests).buffer_unordered(self.args.concurrency.max(1));
        let mut results = Vec::with_capacity(self.inputs.query_indices.len());
        while let Some((query_index, latency, response)) = responses.next().await {
            let query = &dataset.queries[query_index];
            let response = response
                .map_err(|s| {
                    anyhow::anyhow!(
                        "retrieve for {} ({} @ {}) failed: {:?}: {}",
                        query.qid,
                        self.system.label,
                        self.budget,
                        s.code(),
                        s.message()
                    )
                })?
                .into_inner();
            let chunks = self.returned_chunks(&response, check)?;
            let gold = dataset.gold_ranges(query);
            let mut outcome = score_query(query, &gold, &chunks, self.budget, latency);
            outcome.distinct_spans = distinct_spans(&chunks, &|doc_id, start, end| {
                self.gap_is_blank(doc_id, start, end)
            });
            results.push(ScoredQuery {
                query_index,
                outcome,
                chunks,
            });
            self.progress.inc(1);
        }
        results.sort_by_key(|scored| scored.query_index);
        Ok(results)
    }

    /// Whether code points `start..end` of dataset document `doc_id` are only whitespace.
    fn gap_is_blank(&self, doc_id: &str, start: u64, end: u64) -> bool {
        let Some(&document_index) = self.inputs.dataset.document_index.get(doc_id) else {
            return false;
        };
        let bytes = &self.inputs.char_bytes[document_index];
        let text = &self.inputs.dataset.documents[document_index].text;
        bytes
            .get(start as usize)
            .zip(bytes.get(end as usize))
            .and_then(|(&b0, &b1)| text.get(b0..b1))
            .is_some_and(|gap| gap.chars().all(char::is_whitespace))
    }

    /// The response's chunks placed in their dataset documents, checked against the document
    /// text and recounted in the MiniLM tokenizer.
    fn returned_chunks(
        &self,
        response: &proto::RetrieveResponse,
        check: &mut SpanChecks,
    ) -> anyhow::Result<Vec<ReturnedChunk>> {
        let mut chunks = Vec::with_capacity(response.chunks.len());
        for chunk in &response.chunks {
            let (document_index, start, end) = self.place(chunk, check)?;
            let bytes = &self.inputs.char_bytes[document_index];
            let document = &self.inputs.dataset.documents[document_index];
            let expected = bytes
                .get(start as usize)
                .zip(bytes.get(end as usize))
                .and_then(|(&b0, &b1)| document.text.get(b0..b1));
            check.chunks += 1;
            if expected != Some(chunk.text.as_str()) {
                check.offset_mismatches += 1;
            }
            let tokens = self
                .inputs
                .recount_tokenizer
                .encode(chunk.text.as_str(), false)
                .map_err(|e| anyhow::anyhow!("recounting tokens: {e}"))?
                .len() as u64;
            chunks.push(ReturnedChunk {
                doc_id: document.doc_id.clone(),
                start,
                end,
                tokens,
            });
        }
        Ok(chunks)
    }

    /// (dataset document index, first code point, end code point) of a returned chunk; a
    /// baseline chunk's span is within its piece.
    fn place(
        &self,
        chunk: &proto::RetrievedChunk,
        check: &mut SpanChecks,
    ) -> anyhow::Result<(usize, u64, u64)> {
        let span = chunk.chars.unwrap_or_default();
        let Some(baseline) = self.baseline() else {
            let Some(&document_index) = self.inputs.dataset.document_index.get(&chunk.doc_id)
            else {
                anyhow::bail!("the server returned unknown document `{}`", chunk.doc_id);
            };
            return Ok((document_index, span.start, span.end));
        };
        let Some(piece) = baseline.pieces.get(&chunk.doc_id) else {
            anyhow::bail!("the server returned unknown piece `{}`", chunk.doc_id);
        };
        if span.start == 0 && span.end == piece.char_count {
            check.whole_pieces += 1;
        }
        Ok((
            piece.document_index,
            piece.first_char + span.start,
            piece.first_char + span.end,
        ))
    }
}

fn write_run_lines(
    run_file: &mut impl std::io::Write,
    dataset: &Dataset,
    budget: u32,
    label: &str,
    results: &[ScoredQuery],
) -> anyhow::Result<()> {
    for scored in results {
        let line = serde_json::json!({
            "qid": dataset.queries[scored.query_index].qid,
            "budget": budget,
            "strategy": label,
            "chunks": scored.chunks.iter().map(|c| serde_json::json!({
                "doc_id": c.doc_id, "start": c.start, "end": c.end,
            })).collect::<Vec<_>>(),
        });
        writeln!(run_file, "{line}").context("writing the run file")?;
    }
    Ok(())
}

/// Everything the report is made of.
struct ReportInputs<'a> {
    args: &'a EvalArgs,
    inputs: &'a EvalInputs,
    collections: &'a EvalCollections,
    measurements: &'a Measurements,
    /// The server's address, or that it ran in this process.
    server_label: &'a str,
}

/// Span checks, one line per system, reported beside the table.
fn span_check_notes(
    collections: &EvalCollections,
    checks: &HashMap<String, SpanChecks>,
) -> Vec<String> {
    let mut notes = Vec::with_capacity(collections.systems.len());
    for system in &collections.systems {
        let check = checks.get(&system.label).copied().unwrap_or_default();
        let mut line = format!(
            "{}: {} chunks returned, {} with text ≠ document text at the returned code points",
            system.label, check.chunks, check.offset_mismatches
        );
        if let SystemKind::Baseline(i) = system.kind {
            let b = &collections.baselines[i];
            line.push_str(&format!(
                "; {} of them whole {}-character pieces (overlap {})",
                check.whole_pieces, b.chunk_size, b.chunk_overlap
            ));
            debug_assert_eq!(b.name, system.label);
        }
        notes.push(line);
    }
    notes
}

/// Prints the Markdown report and writes it, with the recall plot, to `--out`.
fn write_report(parts: &ReportInputs, run_path: &Path) -> anyhow::Result<()> {
    let ReportInputs {
        args,
        inputs,
        collections,
        measurements,
        server_label,
    } = parts;
    let mut notes = collections.notes.clone();
    notes.extend(span_check_notes(collections, &measurements.checks));
    let labels: Vec<String> = collections
        .systems
        .iter()
        .map(|s| s.label.clone())
        .collect();
    let mut budgets = args.budgets.clone();
    budgets.sort_unstable();
    budgets.dedup();
    let table = report::markdown(&measurements.cells, &labels, &budgets);
    let header = format!(
        "## lathe eval: {}\n\n{} of {} queries (seed {}), {} documents; top_k {} (baselines {}; the system \"defaults\" sends only the query and the budget, the others `diversity` 0), overlap {} tokens; server {}; concurrency {}; {} retrieves in {:.1} s. Latency is client-side wall time per Retrieve over loopback gRPC. Budgets and recounts in the MiniLM tokenizer (no special tokens).\n\n{}\n",
        args.dataset.display(),
        inputs.query_indices.len(),
        inputs.dataset.queries.len(),
        args.seed,
        inputs.dataset.documents.len(),
        args.top_k,
        args.baseline_top_k.unwrap_or(args.top_k),
        args.overlap,
        server_label,
        args.concurrency.max(1),
        measurements.retrieves,
        measurements.elapsed.as_secs_f64(),
        notes.iter().map(|n| format!("- {n}")).collect::<Vec<_>>().join("\n"),
    );
    let markdown = format!("{header}\n{table}");
    println!("{markdown}");
    let results_path = args.out.join("results.md");
    std::fs::write(&results_path, &markdown)
        .with_context(|| format!("writing {}", results_path.display()))?;
    let svg_path = args.out.join("recall.svg");
    report::recall_svg(&svg_path, &measurements.cells, &labels, &budgets)?;
    eprintln!(
        "wrote {}, {} and {}",
        results_path.display(),
        svg_path.display(),
        run_path.display()
    );
    Ok(())
}
