//! `lathe eval <dataset-dir>`: retrieval quality and latency through the real gRPC API.
//!
//! The dataset's documents are ingested into a fresh collection of a running server (`--addr`) or
//! of one started in this process on a loopback port; every query is then run at each budget with
//! each chunking strategy (and, with `--with-baselines`, against LangChain-style pre-chunked
//! collections), scored against the gold answer spans, and reported as a Markdown table, a
//! recall-vs-budget SVG and a run file with the returned spans.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use tonic::transport::Channel;

use crate::api::proto;
use crate::api::proto::lathe_client::LatheClient;
use crate::eval::report::{self, Cell};
use crate::eval::server::InProcessServer;
use crate::eval::splitter::RecursiveCharacterSplitter;
use crate::eval::{score_query, summarize, Dataset, QueryOutcome, ReturnedChunk};

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Folder with docs.jsonl and queries.jsonl (the layout of shared/eval/squad-a).
    pub dataset: PathBuf,
    /// A running server; without it a server is started in this process on a loopback port.
    #[arg(long)]
    pub addr: Option<String>,
    /// Models folder: the MiniLM tokenizer recounts returned tokens, and the in-process server
    /// loads its models from here.
    #[arg(long, default_value = "./models")]
    pub models_dir: PathBuf,
    /// CPU pool threads of the in-process server (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub cpu_threads: usize,
    /// Token budgets, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024")]
    pub budgets: Vec<u32>,
    /// Lathe chunking strategies, comma-separated (fixed, sentence, recursive, structure, auto,
    /// semantic).
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
}

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
    /// Piece document id → (dataset document index, first code point, length in code points).
    pieces: HashMap<String, (usize, u64, u64)>,
}

enum SystemKind {
    Lathe {
        strategy: proto::ChunkStrategy,
        max_tokens: u32,
    },
    Baseline(usize),
}

struct System {
    label: String,
    /// Name written to the run file's `strategy`.
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

fn load_recount_tokenizer(models_dir: &std::path::Path) -> anyhow::Result<tokenizers::Tokenizer> {
    let path = models_dir.join("minilm/tokenizer.json");
    let mut tokenizer = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| anyhow::anyhow!("loading {}: {e}", path.display()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| anyhow::anyhow!("disabling truncation: {e}"))?;
    Ok(tokenizer)
}

async fn create_collection(client: &mut LatheClient<Channel>, name: &str) -> anyhow::Result<()> {
    client
        .create_collection(proto::CreateCollectionRequest {
            name: name.to_string(),
            settings: None,
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
    let mut messages = Vec::with_capacity(documents.len().div_ceil(UPLOAD_BATCH));
    let mut documents = documents.into_iter().peekable();
    while documents.peek().is_some() {
        messages.push(proto::UpsertDocumentsRequest {
            collection: collection.to_string(),
            documents: documents.by_ref().take(UPLOAD_BATCH).collect(),
            wait: true,
        });
    }
    let response = client
        .upload_documents(tokio_stream::iter(messages))
        .await
        .map_err(|s| anyhow::anyhow!("uploading to {collection}: {:?}: {}", s.code(), s.message()))?
        .into_inner();
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
    let dataset = Arc::new(
        Dataset::load(&args.dataset)
            .with_context(|| format!("loading the dataset in {}", args.dataset.display()))?,
    );
    let query_indices = sample_queries(&dataset, args.max_queries, args.seed);
    let tokenizer = Arc::new(load_recount_tokenizer(&args.models_dir)?);
    let mut systems = Vec::new();
    for &max_tokens in &args.max_tokens {
        for name in &args.strategies {
            systems.push(System {
                label: format!("{name}/{max_tokens}"),
                kind: SystemKind::Lathe {
                    strategy: super::parse_strategy(name)?,
                    max_tokens,
                },
            });
        }
    }
    let baseline_names: Vec<String> = match (&args.baselines, args.with_baselines) {
        (Some(names), _) => names.clone(),
        (None, true) => DEFAULT_BASELINES.iter().map(|s| s.to_string()).collect(),
        (None, false) => Vec::new(),
    };

    let server = match &args.addr {
        Some(_) => None,
        None => {
            eprintln!("starting an in-process server on a loopback port");
            Some(InProcessServer::start(&args.models_dir, args.cpu_threads).await?)
        }
    };
    let address = match (&args.addr, &server) {
        (Some(addr), _) => addr.clone(),
        (None, Some(server)) => server.addr(),
        (None, None) => unreachable!("a server was started"),
    };
    let mut client = super::connect(&address).await?;
    let run_id = format!(
        "eval-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );

    // Ingest: Lathe's collection, then one collection per baseline.
    let mut notes = Vec::new();
    let lathe_collection = format!("{run_id}-lathe");
    let mut collections = Vec::new();
    if !systems.is_empty() {
        create_collection(&mut client, &lathe_collection).await?;
        collections.push(lathe_collection.clone());
        let with_sections = args.ingest_as == "sections";
        let documents = dataset
            .documents
            .iter()
            .map(|d| proto::Document {
                id: d.doc_id.clone(),
                title: d.title.clone(),
                text: d.text.clone(),
                format: proto::DocumentFormat::Plain as i32,
                metadata: HashMap::new(),
                sections: if with_sections {
                    d.sections
                        .iter()
                        .map(|s| proto::SectionBoundary {
                            start: s.start,
                            end: s.end,
                            title: String::new(),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            })
            .collect();
        let (docs, sections, seconds) = upload(&mut client, &lathe_collection, documents).await?;
        notes.push(format!(
            "Lathe collection: {docs} documents ingested as {} → {sections} sections in {seconds:.2} s.",
            args.ingest_as
        ));
    }
    let mut baselines = Vec::new();
    for name in &baseline_names {
        let (chunk_size, chunk_overlap) = parse_baseline(name)?;
        let collection = format!("{run_id}-{name}");
        create_collection(&mut client, &collection).await?;
        collections.push(collection.clone());
        let splitter = RecursiveCharacterSplitter::new(chunk_size, chunk_overlap);
        let mut pieces = HashMap::new();
        let mut documents = Vec::new();
        for (doc_index, document) in dataset.documents.iter().enumerate() {
            let bytes = char_to_byte(&document.text);
            for (ordinal, range) in splitter.split_chars(&document.text).into_iter().enumerate() {
                let text = &document.text[bytes[range.start as usize]..bytes[range.end as usize]];
                let id = format!("{}~{ordinal}", document.doc_id);
                let length = range.end - range.start;
                pieces.insert(id.clone(), (doc_index, range.start, length));
                documents.push(proto::Document {
                    id,
                    title: document.title.clone(),
                    text: text.to_string(),
                    format: proto::DocumentFormat::Plain as i32,
                    metadata: HashMap::new(),
                    sections: vec![proto::SectionBoundary {
                        start: 0,
                        end: length,
                        title: String::new(),
                    }],
                });
            }
        }
        let piece_count = documents.len();
        let (_, sections, seconds) = upload(&mut client, &collection, documents).await?;
        notes.push(format!(
            "Baseline {name}: {piece_count} pieces (LangChain RecursiveCharacterTextSplitter semantics, chunk_size {chunk_size}, chunk_overlap {chunk_overlap} characters) indexed as {sections} caller-given sections in {seconds:.2} s."
        ));
        systems.push(System {
            label: name.clone(),
            kind: SystemKind::Baseline(baselines.len()),
        });
        baselines.push(Baseline {
            name: name.clone(),
            chunk_size,
            chunk_overlap,
            collection,
            pieces,
        });
    }
    if systems.is_empty() {
        anyhow::bail!("nothing to evaluate: give --strategies or --baselines");
    }
    let baselines = Arc::new(baselines);
    let char_bytes: Arc<Vec<Vec<usize>>> = Arc::new(
        dataset
            .documents
            .iter()
            .map(|d| char_to_byte(&d.text))
            .collect(),
    );

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let run_path = args
        .run_file
        .clone()
        .unwrap_or_else(|| args.out.join("run.jsonl"));
    let mut run_file = std::io::BufWriter::new(
        std::fs::File::create(&run_path)
            .with_context(|| format!("creating {}", run_path.display()))?,
    );

    let total = (systems.len() * args.budgets.len() * query_indices.len()) as u64;
    let progress = ProgressBar::new(total);
    progress.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40.cyan/blue}] {pos}/{len} {per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut cells = Vec::new();
    let mut checks: HashMap<String, SpanChecks> = HashMap::new();
    let started = Instant::now();
    for system in &systems {
        for &budget in &args.budgets {
            progress.set_message(format!("{} @ {budget}", system.label));
            let (collection, chunking) = match &system.kind {
                SystemKind::Lathe {
                    strategy,
                    max_tokens,
                } => (
                    lathe_collection.clone(),
                    proto::ChunkingOptions {
                        strategy: *strategy as i32,
                        max_tokens: Some(*max_tokens),
                        overlap_tokens: Some(args.overlap),
                        unit: proto::ChunkUnit::Tokens as i32,
                        separators: Vec::new(),
                        ..Default::default()
                    },
                ),
                // One chunk per piece: no re-chunking, the server only packs whole pieces.
                SystemKind::Baseline(i) => (
                    baselines[*i].collection.clone(),
                    proto::ChunkingOptions {
                        strategy: proto::ChunkStrategy::Fixed as i32,
                        max_tokens: Some(WHOLE_SECTION_TOKENS),
                        overlap_tokens: Some(0),
                        unit: proto::ChunkUnit::Tokens as i32,
                        separators: Vec::new(),
                        ..Default::default()
                    },
                ),
            };
            let baseline_index = match system.kind {
                SystemKind::Baseline(i) => Some(i),
                SystemKind::Lathe { .. } => None,
            };
            let top_k = match baseline_index {
                Some(_) => args.baseline_top_k.unwrap_or(args.top_k),
                None => args.top_k,
            };
            let requests = query_indices.iter().copied().map(|query_index| {
                let mut client = client.clone();
                let request = proto::RetrieveRequest {
                    collection: collection.clone(),
                    query: dataset.queries[query_index].question.clone(),
                    top_k: Some(top_k),
                    token_budget: budget,
                    chunking: Some(chunking.clone()),
                    filter: None,
                    order: proto::ResultOrder::Score as i32,
                };
                async move {
                    let sent = Instant::now();
                    let response = client.retrieve(request).await;
                    (query_index, sent.elapsed(), response)
                }
            });
            let mut responses =
                futures::stream::iter(requests).buffer_unordered(args.concurrency.max(1));
            let mut results: Vec<(usize, QueryOutcome, Vec<ReturnedChunk>)> =
                Vec::with_capacity(query_indices.len());
            let check = checks.entry(system.label.clone()).or_default();
            while let Some((query_index, latency, response)) = responses.next().await {
                let query = &dataset.queries[query_index];
                let response = response
                    .map_err(|s| {
                        anyhow::anyhow!(
                            "retrieve for {} ({} @ {budget}) failed: {:?}: {}",
                            query.qid,
                            system.label,
                            s.code(),
                            s.message()
                        )
                    })?
                    .into_inner();
                let mut chunks = Vec::with_capacity(response.chunks.len());
                for chunk in &response.chunks {
                    let span = chunk.chars.unwrap_or_default();
                    let (doc_index, start, end) = match baseline_index {
                        None => {
                            let Some(&doc_index) = dataset.document_index.get(&chunk.doc_id) else {
                                anyhow::bail!(
                                    "the server returned unknown document `{}`",
                                    chunk.doc_id
                                );
                            };
                            (doc_index, span.start, span.end)
                        }
                        Some(b) => {
                            let Some(&(doc_index, offset, length)) =
                                baselines[b].pieces.get(&chunk.doc_id)
                            else {
                                anyhow::bail!(
                                    "the server returned unknown piece `{}`",
                                    chunk.doc_id
                                );
                            };
                            if span.start == 0 && span.end == length {
                                check.whole_pieces += 1;
                            }
                            (doc_index, offset + span.start, offset + span.end)
                        }
                    };
                    let bytes = &char_bytes[doc_index];
                    let document = &dataset.documents[doc_index];
                    let expected = bytes
                        .get(start as usize)
                        .zip(bytes.get(end as usize))
                        .and_then(|(&b0, &b1)| document.text.get(b0..b1));
                    check.chunks += 1;
                    if expected != Some(chunk.text.as_str()) {
                        check.offset_mismatches += 1;
                    }
                    let tokens = tokenizer
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
                let gold = dataset.gold_ranges(query);
                let outcome = score_query(query, &gold, &chunks, budget, latency);
                results.push((query_index, outcome, chunks));
                progress.inc(1);
            }
            results.sort_by_key(|(query_index, _, _)| *query_index);
            for (query_index, _, chunks) in &results {
                let line = serde_json::json!({
                    "qid": dataset.queries[*query_index].qid,
                    "budget": budget,
                    "strategy": system.label,
                    "chunks": chunks.iter().map(|c| serde_json::json!({
                        "doc_id": c.doc_id, "start": c.start, "end": c.end,
                    })).collect::<Vec<_>>(),
                });
                writeln!(run_file, "{line}").context("writing the run file")?;
            }
            let outcomes: Vec<QueryOutcome> = results.into_iter().map(|(_, o, _)| o).collect();
            cells.push(Cell {
                budget,
                system: system.label.clone(),
                summary: summarize(&outcomes),
            });
        }
    }
    progress.finish_and_clear();
    run_file.flush().context("writing the run file")?;
    let elapsed = started.elapsed();

    // Span checks, reported beside the table.
    for system in &systems {
        let check = checks.get(&system.label).copied().unwrap_or_default();
        let mut line = format!(
            "{}: {} chunks returned, {} with text ≠ document text at the returned code points",
            system.label, check.chunks, check.offset_mismatches
        );
        if let SystemKind::Baseline(i) = system.kind {
            let b = &baselines[i];
            line.push_str(&format!(
                "; {} of them whole {}-character pieces (overlap {})",
                check.whole_pieces, b.chunk_size, b.chunk_overlap
            ));
            debug_assert_eq!(b.name, system.label);
        }
        notes.push(line);
    }

    let labels: Vec<String> = systems.iter().map(|s| s.label.clone()).collect();
    let mut budgets = args.budgets.clone();
    budgets.sort_unstable();
    budgets.dedup();
    let table = report::markdown(&cells, &labels, &budgets);
    let header = format!(
        "## lathe eval: {}\n\n{} of {} queries (seed {}), {} documents; top_k {} (baselines {}), overlap {} tokens; server {}; concurrency {}; {} retrieves in {:.1} s. Latency is client-side wall time per Retrieve over loopback gRPC. Budgets and recounts in the MiniLM tokenizer (no special tokens).\n\n{}\n",
        args.dataset.display(),
        query_indices.len(),
        dataset.queries.len(),
        args.seed,
        dataset.documents.len(),
        args.top_k,
        args.baseline_top_k.unwrap_or(args.top_k),
        args.overlap,
        if args.addr.is_some() { address.as_str() } else { "in-process (loopback)" },
        args.concurrency.max(1),
        total,
        elapsed.as_secs_f64(),
        notes.iter().map(|n| format!("- {n}")).collect::<Vec<_>>().join("\n"),
    );
    let markdown = format!("{header}\n{table}");
    println!("{markdown}");
    let results_path = args.out.join("results.md");
    std::fs::write(&results_path, &markdown)
        .with_context(|| format!("writing {}", results_path.display()))?;
    let svg_path = args.out.join("recall.svg");
    report::recall_svg(&svg_path, &cells, &labels, &budgets)?;
    eprintln!(
        "wrote {}, {} and {}",
        results_path.display(),
        svg_path.display(),
        run_path.display()
    );

    match server {
        Some(server) => server.stop().await?,
        None if !args.keep_collections => {
            for collection in collections {
                let _ = client
                    .delete_collection(proto::DeleteCollectionRequest { name: collection })
                    .await;
            }
        }
        None => {}
    }
    Ok(())
}
