//! Retrieval evaluation: the dataset format of `shared/eval` (docs.jsonl with paragraph sections,
//! queries.jsonl with answer spans in code points), the per-query metrics, their aggregates, the
//! report (Markdown table and recall plot) and the LangChain-style baseline splitter. `lathe eval`
//! and `lathe-load` are built on it and on `client` (connect, or start a server in this process).

pub mod report;
pub mod splitter;

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

/// A paragraph of a dataset document, in code points.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct CharSpan {
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DatasetDocument {
    pub doc_id: String,
    #[serde(default)]
    pub title: String,
    pub text: String,
    #[serde(default)]
    pub sections: Vec<CharSpan>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Answer {
    #[serde(default)]
    pub text: String,
    pub start: u64,
    pub end: u64,
    #[serde(default)]
    pub section: Option<usize>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DatasetQuery {
    pub qid: String,
    pub question: String,
    pub doc_id: String,
    #[serde(default)]
    pub gold_sections: Vec<usize>,
    pub answers: Vec<Answer>,
}

#[derive(Clone, Debug)]
pub struct Dataset {
    pub documents: Vec<DatasetDocument>,
    pub queries: Vec<DatasetQuery>,
    /// doc_id → index into `documents`.
    pub document_index: HashMap<String, usize>,
}

impl Dataset {
    /// Reads `<dir>/docs.jsonl` and `<dir>/queries.jsonl`; every query must name a known document.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let documents: Vec<DatasetDocument> = read_jsonl(&dir.join("docs.jsonl"))?;
        let queries: Vec<DatasetQuery> = read_jsonl(&dir.join("queries.jsonl"))?;
        let mut document_index = HashMap::with_capacity(documents.len());
        for (i, document) in documents.iter().enumerate() {
            if document_index.insert(document.doc_id.clone(), i).is_some() {
                anyhow::bail!("docs.jsonl: doc_id `{}` appears twice", document.doc_id);
            }
        }
        for query in &queries {
            if !document_index.contains_key(&query.doc_id) {
                anyhow::bail!(
                    "queries.jsonl: query {} names unknown document `{}`",
                    query.qid,
                    query.doc_id
                );
            }
        }
        Ok(Self {
            documents,
            queries,
            document_index,
        })
    }

    pub fn document(&self, doc_id: &str) -> Option<&DatasetDocument> {
        self.document_index.get(doc_id).map(|&i| &self.documents[i])
    }

    /// Code-point ranges of the query's gold sections in its document.
    /// The documents as plain-text proto documents, with the dataset's paragraphs as caller-given
    /// sections when `with_sections` (else the server cuts the sections).
    pub fn proto_documents(&self, with_sections: bool) -> Vec<crate::proto::Document> {
        use crate::proto;
        self.documents
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
            .collect()
    }

    pub fn gold_ranges(&self, query: &DatasetQuery) -> Vec<Range<u64>> {
        let Some(document) = self.document(&query.doc_id) else {
            return Vec::new();
        };
        query
            .gold_sections
            .iter()
            .filter_map(|&i| document.sections.get(i))
            .map(|s| s.start..s.end)
            .collect()
    }
}

fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{}:{}: malformed line", path.display(), number + 1))
        })
        .collect()
}

/// One returned chunk, mapped to the dataset document it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReturnedChunk {
    pub doc_id: String,
    /// Code points into the dataset document's text.
    pub start: u64,
    pub end: u64,
    /// The chunk's text recounted in the budget tokenizer.
    pub tokens: u64,
}

/// What one retrieve scored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueryOutcome {
    /// 1-based rank of the first chunk of the gold document holding a whole gold answer.
    pub answer_rank: Option<usize>,
    pub doc_hit: bool,
    pub returned_chars: u64,
    pub gold_chars: u64,
    pub tokens: u64,
    pub over_budget: bool,
    /// Returned tokens / budget.
    pub fill_rate: f64,
    /// Contiguous stretches of text the answer is made of ([`distinct_spans`]).
    pub distinct_spans: u64,
    pub latency: Duration,
}

/// Scores one response (chunks in the order returned) against the query's gold data.
pub fn score_query(
    query: &DatasetQuery,
    gold_ranges: &[Range<u64>],
    chunks: &[ReturnedChunk],
    budget: u32,
    latency: Duration,
) -> QueryOutcome {
    let mut outcome = QueryOutcome {
        latency,
        ..QueryOutcome::default()
    };
    for (rank, chunk) in chunks.iter().enumerate() {
        outcome.tokens += chunk.tokens;
        outcome.returned_chars += chunk.end.saturating_sub(chunk.start);
        if chunk.doc_id != query.doc_id {
            continue;
        }
        outcome.doc_hit = true;
        outcome.gold_chars += gold_ranges
            .iter()
            .map(|gold| overlap(gold, &(chunk.start..chunk.end)))
            .sum::<u64>();
        let holds_answer = query
            .answers
            .iter()
            .any(|answer| chunk.start <= answer.start && answer.end <= chunk.end);
        if holds_answer && outcome.answer_rank.is_none() {
            outcome.answer_rank = Some(rank + 1);
        }
    }
    outcome.over_budget = outcome.tokens > budget as u64;
    outcome.fill_rate = outcome.tokens as f64 / budget.max(1) as f64;
    outcome
}

/// How many contiguous stretches of document text the chunks make once merged: chunks of one
/// document that overlap, touch, or are separated only by what `blank_gap(doc_id, start, end)`
/// calls blank (whitespace between two sentences) count as one. Fewer, longer spans read better.
pub fn distinct_spans(chunks: &[ReturnedChunk], blank_gap: &dyn Fn(&str, u64, u64) -> bool) -> u64 {
    let mut spans: Vec<(&str, u64, u64)> = chunks
        .iter()
        .map(|c| (c.doc_id.as_str(), c.start, c.end))
        .collect();
    spans.sort_unstable();
    let mut count = 0;
    let mut open: Option<(&str, u64)> = None;
    for (doc_id, start, end) in spans {
        match open {
            Some((open_doc, open_end))
                if open_doc == doc_id
                    && (start <= open_end || blank_gap(doc_id, open_end, start)) =>
            {
                open = Some((doc_id, open_end.max(end)));
            }
            _ => {
                count += 1;
                open = Some((doc_id, end));
            }
        }
    }
    count
}

fn overlap(a: &Range<u64>, b: &Range<u64>) -> u64 {
    a.end.min(b.end).saturating_sub(a.start.max(b.start))
}

/// Aggregates of one (budget, system) cell.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub queries: usize,
    pub answer_recall: f64,
    pub mrr: f64,
    pub doc_hit: f64,
    /// Mean over queries of gold characters / returned characters (0 when nothing returned).
    pub gold_precision: f64,
    pub over_budget: f64,
    pub mean_tokens: f64,
    /// Mean over queries of returned tokens / budget.
    pub fill_rate: f64,
    /// Mean over queries of [`distinct_spans`].
    pub distinct_spans: f64,
    pub latency_p50: Duration,
    pub latency_p95: Duration,
    pub latency_p99: Duration,
}

pub fn summarize(outcomes: &[QueryOutcome]) -> Summary {
    if outcomes.is_empty() {
        return Summary::default();
    }
    let n = outcomes.len() as f64;
    let share =
        |f: &dyn Fn(&QueryOutcome) -> bool| outcomes.iter().filter(|o| f(o)).count() as f64 / n;
    let mean = |f: &dyn Fn(&QueryOutcome) -> f64| outcomes.iter().map(f).sum::<f64>() / n;
    let mut latencies: Vec<Duration> = outcomes.iter().map(|o| o.latency).collect();
    latencies.sort_unstable();
    Summary {
        queries: outcomes.len(),
        answer_recall: share(&|o| o.answer_rank.is_some()),
        mrr: mean(&|o| o.answer_rank.map_or(0.0, |r| 1.0 / r as f64)),
        doc_hit: share(&|o| o.doc_hit),
        gold_precision: mean(&|o| {
            if o.returned_chars == 0 {
                0.0
            } else {
                o.gold_chars as f64 / o.returned_chars as f64
            }
        }),
        over_budget: share(&|o| o.over_budget),
        mean_tokens: mean(&|o| o.tokens as f64),
        fill_rate: mean(&|o| o.fill_rate),
        distinct_spans: mean(&|o| o.distinct_spans as f64),
        latency_p50: percentile(&latencies, 50.0),
        latency_p95: percentile(&latencies, 95.0),
        latency_p99: percentile(&latencies, 99.0),
    }
}

/// Nearest-rank percentile of sorted values (the smallest value with at least p% at or below).
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query() -> DatasetQuery {
        DatasetQuery {
            qid: "q".into(),
            question: "who?".into(),
            doc_id: "d".into(),
            gold_sections: vec![0],
            answers: vec![Answer {
                text: "x".into(),
                start: 10,
                end: 14,
                section: Some(0),
            }],
        }
    }

    fn chunk(doc_id: &str, start: u64, end: u64, tokens: u64) -> ReturnedChunk {
        ReturnedChunk {
            doc_id: doc_id.into(),
            start,
            end,
            tokens,
        }
    }

    #[test]
    fn answer_must_lie_wholly_inside_a_chunk_of_the_gold_document() {
        let gold: Vec<Range<u64>> = std::iter::once(0..20).collect();
        let chunks = vec![
            chunk("other", 0, 100, 5),
            chunk("d", 0, 12, 5),
            chunk("d", 8, 30, 5),
        ];
        let outcome = score_query(&query(), &gold, &chunks, 15, Duration::ZERO);
        assert_eq!(outcome.answer_rank, Some(3));
        assert!(outcome.doc_hit);
        assert_eq!(outcome.returned_chars, 100 + 12 + 22);
        assert_eq!(outcome.gold_chars, 12 + 12);
        assert_eq!(outcome.tokens, 15);
        assert!(!outcome.over_budget);
        assert_eq!(outcome.fill_rate, 1.0);
    }

    #[test]
    fn spans_that_overlap_touch_or_are_split_by_a_blank_gap_count_once() {
        // Document "d" has a blank gap at 20..22 only.
        let blank = |doc_id: &str, start: u64, end: u64| doc_id == "d" && start == 20 && end == 22;
        let chunks = vec![
            chunk("d", 22, 30, 1), // after the blank gap: joins 10..20
            chunk("d", 10, 20, 1),
            chunk("d", 25, 40, 1), // overlaps 22..30
            chunk("d", 40, 45, 1), // touches 25..40
            chunk("d", 50, 60, 1), // a real gap: a new span
            chunk("e", 60, 70, 1), // another document
            chunk("e", 22, 25, 1), // 20..22 is blank in "d" only: a new span
            chunk("e", 0, 20, 1),
        ];
        assert_eq!(distinct_spans(&chunks, &blank), 5);
        assert_eq!(distinct_spans(&[], &blank), 0);
        let never = |_: &str, _: u64, _: u64| false;
        assert_eq!(distinct_spans(&chunks[..2], &never), 2);
    }

    #[test]
    fn summary_averages_over_queries() {
        let hit = QueryOutcome {
            answer_rank: Some(2),
            doc_hit: true,
            returned_chars: 10,
            gold_chars: 5,
            tokens: 100,
            over_budget: false,
            fill_rate: 0.8,
            distinct_spans: 3,
            latency: Duration::from_millis(2),
        };
        let miss = QueryOutcome {
            latency: Duration::from_millis(4),
            ..QueryOutcome::default()
        };
        let summary = summarize(&[hit, miss]);
        assert_eq!(summary.answer_recall, 0.5);
        assert_eq!(summary.mrr, 0.25);
        assert_eq!(summary.gold_precision, 0.25);
        assert_eq!(summary.mean_tokens, 50.0);
        assert_eq!(summary.fill_rate, 0.4);
        assert_eq!(summary.distinct_spans, 1.5);
        assert_eq!(summary.latency_p50, Duration::from_millis(2));
        assert_eq!(summary.latency_p99, Duration::from_millis(4));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&values, 50.0), 50);
        assert_eq!(percentile(&values, 99.0), 99);
        assert_eq!(percentile(&values, 100.0), 100);
        assert_eq!(percentile::<u32>(&[], 50.0), 0);
    }
}
