//! The collections `lathe eval` measures: Lathe's (the dataset's documents, cut into sections by
//! the server or with the dataset's own), and one per LangChain-style baseline, whose pieces are
//! each a document of one caller-given section; with `--reuse`, those already on the server.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::progress::{applied, watch, UploadProgress};
use super::{EvalArgs, EvalInputs, System, SystemKind};
use crate::client::{status_line, unique_collection_name, upload_in_batches};
use crate::eval::splitter::RecursiveCharacterSplitter;
use crate::proto;

const DEFAULT_BASELINES: [&str; 2] = ["recursive-400-0", "recursive-1000-200"];
const UPLOAD_BATCH: usize = 256;

/// A pre-chunked baseline: each piece is its own document (pieces overlap, and caller-given
/// sections of one document may not), indexed as one caller-given section.
pub(super) struct Baseline {
    pub(super) name: String,
    pub(super) chunk_size: usize,
    pub(super) chunk_overlap: usize,
    pub(super) collection: String,
    /// Piece document id → where the piece lies in the dataset.
    pub(super) pieces: HashMap<String, PiecePlace>,
}

/// Where a baseline piece lies: its dataset document and its code points there.
#[derive(Clone, Copy)]
pub(super) struct PiecePlace {
    pub(super) document_index: usize,
    pub(super) first_char: u64,
    pub(super) char_count: u64,
}

/// The collections of one evaluation and the systems measured on them.
pub(super) struct EvalCollections {
    pub(super) lathe_collection: String,
    /// Every collection created (deleted at the end on a given server).
    pub(super) created: Vec<String>,
    pub(super) baselines: Vec<Baseline>,
    pub(super) systems: Vec<System>,
    /// Lines of the report that say what was ingested.
    pub(super) notes: Vec<String>,
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

async fn create_collection(
    client: &mut crate::client::Client,
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
        .map_err(|s| anyhow::anyhow!("creating collection {name}: {}", status_line(&s)))?;
    Ok(())
}

/// Streams `documents` in batches, reporting progress every `every` (see `progress`); returns
/// (documents, sections, seconds).
async fn upload(
    client: &mut crate::client::Client,
    collection: &str,
    documents: Vec<proto::Document>,
    every: Duration,
) -> anyhow::Result<(u32, u32, f64)> {
    let started = Instant::now();
    let progress = UploadProgress {
        collection: collection.to_string(),
        total_documents: documents.len() as u64,
        total_bytes: documents.iter().map(|d| d.text.len() as u64).sum(),
        started,
    };
    let watcher = client.clone();
    let response = tokio::select! {
        response = upload_in_batches(client, collection, documents, UPLOAD_BATCH) => response,
        never = watch(watcher, &progress, every) => match never {},
    };
    let response =
        response.map_err(|s| anyhow::anyhow!("uploading to {collection}: {}", status_line(&s)))?;
    if !std::io::stderr().is_terminal() {
        if let Some((documents, bytes)) = applied(client, collection).await {
            eprintln!("{}", progress.line(documents, bytes));
        }
    }
    Ok((
        response.documents,
        response.sections,
        started.elapsed().as_secs_f64(),
    ))
}

/// `--progress-seconds` as a duration.
fn progress_interval(args: &EvalArgs) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(args.progress_seconds)
        .ok()
        .filter(|every| !every.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--progress-seconds must be above 0"))
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
pub(super) async fn ingest_collections(
    client: &mut crate::client::Client,
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
            let every = progress_interval(args)?;
            let (docs, sections, seconds) = upload(client, &collection, documents, every).await?;
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
        let every = progress_interval(args)?;
        let upload_pieces = upload_pieces.then_some(every);
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
    client: &mut crate::client::Client,
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
            "looking up collection {collection}: {}",
            status_line(&status)
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

/// Splits every document into the baseline's pieces and, with `upload_pieces` (the interval of
/// its progress lines), uploads each piece as a document of one caller-given section; returns
/// the baseline and its note for the report.
async fn ingest_baseline(
    client: &mut crate::client::Client,
    inputs: &EvalInputs,
    name: &str,
    collection: String,
    upload_pieces: Option<Duration>,
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
    let indexed = if let Some(every) = upload_pieces {
        let (_, sections, seconds) = upload(client, &collection, documents, every).await?;
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
