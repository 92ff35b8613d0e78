//! The timed part of `lathe eval`: every sampled query at each budget for every system, each
//! answer placed in its dataset document, checked against its text, recounted in the MiniLM
//! tokenizer, scored, and written to the run file.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};

use super::collections::{Baseline, EvalCollections};
use super::{EvalArgs, EvalInputs, System, SystemKind};
use crate::eval::report::Cell;
use crate::eval::{distinct_spans, score_query, summarize, Dataset, QueryOutcome, ReturnedChunk};
use crate::proto;

/// `limits.max_chunk_tokens` of the default configuration: a baseline piece is one chunk.
const WHOLE_SECTION_TOKENS: u32 = 8_192;

/// Checks of the returned spans, kept per system.
#[derive(Default, Clone, Copy)]
pub(super) struct SpanChecks {
    pub(super) chunks: u64,
    /// Chunks whose text differs from the document text at the returned code points.
    pub(super) offset_mismatches: u64,
    /// Baselines: chunks that are a whole piece.
    pub(super) whole_pieces: u64,
}

/// What the timed part produced.
pub(super) struct Measurements {
    pub(super) cells: Vec<Cell>,
    pub(super) checks: HashMap<String, SpanChecks>,
    pub(super) retrieves: u64,
    pub(super) elapsed: Duration,
}

/// One query's answer, scored.
struct ScoredQuery {
    query_index: usize,
    outcome: QueryOutcome,
    chunks: Vec<ReturnedChunk>,
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
pub(super) async fn measure(
    client: &crate::client::Client,
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
        client: &crate::client::Client,
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
                        "retrieve for {} ({} @ {}) failed: {}",
                        query.qid,
                        self.system.label,
                        self.budget,
                        crate::client::status_line(&s)
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
