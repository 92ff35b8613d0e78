//! The score stage: score fine chunks. Each signal is computed per chunk, normalised over the candidates of
//! this query, and fused linearly with weights from config; the neural stage adds `dense`.

use std::sync::Arc;

use super::{Candidate, QueryTerms, SectionAnalysis};
use crate::embed::QuantizedVectors;
use crate::index::SectionHit;

const BM25_K1: f32 = 1.2;
const BM25_B: f32 = 0.75;

#[derive(Clone, Copy, Debug)]
pub struct Weights {
    pub bm25: f32,
    pub section: f32,
    pub dense: f32,
}

impl Weights {
    /// The highest score a chunk can have: the sum of the weights of the signals
    /// [`fuse_signals`] adds, each normalised to 0..1 (the dense one only with a query vector).
    pub fn score_range(&self, has_query_vector: bool) -> f32 {
        let dense = if has_query_vector { self.dense } else { 0.0 };
        self.bm25 + self.section + dense
    }
}

/// Scores `candidates` in place and sorts them best first (ties by position, for determinism).
#[tracing::instrument(level = "debug", skip_all, fields(candidates = candidates.len()))]
pub fn score(
    candidates: &mut [Candidate],
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    query: &QueryTerms,
    query_vector: Option<&[f32]>,
    weights: Weights,
) {
    if candidates.is_empty() {
        return;
    }
    raw_signals(candidates, hits, analyses, query, query_vector);
    fuse_signals(candidates, query_vector.is_some(), weights);
    candidates.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.hit_index.cmp(&b.hit_index))
            .then(a.start.cmp(&b.start))
    });
}

/// The target of the trace event that lists a query's scored candidates ([`trace_candidates`]).
pub const CANDIDATES_TARGET: &str = "lathe::candidates";

/// One scored candidate as [`trace_candidates`] writes it: its document, its byte range in the
/// document, its budget tokens, its section's rank in the coarse stage, its score and the raw
/// signals the score was fused from.
#[derive(serde::Serialize)]
struct TracedCandidate<'a> {
    doc_id: &'a str,
    start: u64,
    end: u64,
    tokens: u32,
    section_rank: u32,
    score: f32,
    bm25: f32,
    section: f32,
    dense: f32,
}

/// Emits, at TRACE level under [`CANDIDATES_TARGET`], `candidates` in the order the pack stage
/// reads them, as a JSON array: what is needed to replay the pack with another fusion of the
/// same signals offline (`scripts/eval-pack-replay.py`). Nothing is built unless that target
/// is enabled (`log.filter = "info,lathe::candidates=trace"`).
pub fn trace_candidates(
    query: &str,
    budget: u32,
    diversified: bool,
    candidates: &[Candidate],
    hits: &[SectionHit],
) {
    if !tracing::enabled!(target: CANDIDATES_TARGET, tracing::Level::TRACE) {
        return;
    }
    let traced: Vec<TracedCandidate> = candidates
        .iter()
        .map(|candidate| {
            let hit = &hits[candidate.hit_index as usize];
            TracedCandidate {
                doc_id: &hit.doc_id,
                start: hit.byte_start + u64::from(candidate.start),
                end: hit.byte_start + u64::from(candidate.end),
                tokens: candidate.token_count,
                section_rank: candidate.hit_index,
                score: candidate.score,
                bm25: candidate.parts.bm25,
                section: candidate.parts.section,
                dense: candidate.parts.dense,
            }
        })
        .collect();
    let candidates = serde_json::to_string(&traced).unwrap_or_default();
    tracing::trace!(target: CANDIDATES_TARGET, query, budget, diversified, %candidates);
}

/// Each candidate's BM25 over its own text (idf over the candidates: [`candidate_idf`]), its
/// section's coarse score relative to the best section's, and its cosine to the query vector (0
/// without one).
fn raw_signals(
    candidates: &mut [Candidate],
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    query: &QueryTerms,
    query_vector: Option<&[f32]>,
) {
    let lengths = chunk_lengths(candidates, analyses);
    let average_length =
        (lengths.iter().map(|&l| l as f32).sum::<f32>() / lengths.len() as f32).max(1.0);
    let max_section_score = hits.iter().map(|hit| hit.score).fold(0.0f32, f32::max);

    // Query-term occurrences per section, found once and reused by all of its chunks; each
    // candidate's term frequencies, one row of `terms` per candidate.
    let terms = query.hashes.len().max(1);
    let mut matches: Vec<(u32, u16)> = Vec::new();
    let mut frequencies = vec![0u32; candidates.len() * terms];
    let mut current_section = u32::MAX;
    let mut dense = DenseScorer::new(query_vector);
    for (candidate, tf) in candidates
        .iter_mut()
        .zip(frequencies.chunks_exact_mut(terms))
    {
        if candidate.hit_index != current_section {
            current_section = candidate.hit_index;
            query_matches(&analyses[current_section as usize], query, &mut matches);
            dense.enter_section(&hits[current_section as usize]);
        }
        candidate.parts.dense = dense.similarity(candidate.start, candidate.end);
        let first = matches.partition_point(|&(offset, _)| offset < candidate.start);
        for &(offset, term) in &matches[first..] {
            if offset >= candidate.end {
                break;
            }
            tf[term as usize] += 1;
        }
        let section_score = hits
            .get(candidate.hit_index as usize)
            .map_or(0.0, |hit: &SectionHit| hit.score);
        candidate.parts.section = if max_section_score > 0.0 {
            section_score / max_section_score
        } else {
            0.0
        };
    }
    let idf = candidate_idf(&frequencies, terms);
    for ((candidate, &length), tf) in candidates
        .iter_mut()
        .zip(&lengths)
        .zip(frequencies.chunks_exact(terms))
    {
        let length_norm = 1.0 - BM25_B + BM25_B * length as f32 / average_length;
        candidate.parts.bm25 = tf
            .iter()
            .zip(&idf)
            .filter(|(&tf, _)| tf > 0)
            .map(|(&tf, &idf)| {
                idf * tf as f32 * (BM25_K1 + 1.0) / (tf as f32 + BM25_K1 * length_norm)
            })
            .sum();
    }
}

/// BM25's idf of each query term over this query's candidates, `ln(1 + (N - n + 0.5) / (n +
/// 0.5))` with N the candidates and n those holding the term (`frequencies`: one row of `terms`
/// per candidate). The coarse stage already ranked sections with the collection's idf; among the
/// chunks it kept, a term most of them hold (the topic's own words, which brought them here)
/// tells them apart little, and the words only a few hold are what a question asks about.
fn candidate_idf(frequencies: &[u32], terms: usize) -> Vec<f32> {
    let mut holding = vec![0u32; terms];
    for tf in frequencies.chunks_exact(terms) {
        for (n, &f) in holding.iter_mut().zip(tf) {
            *n += u32::from(f > 0);
        }
    }
    let total = (frequencies.len() / terms) as f32;
    holding
        .iter()
        .map(|&n| (1.0 + (total - n as f32 + 0.5) / (n as f32 + 0.5)).ln())
        .collect()
}

/// Normalises BM25 and dense over this query's candidates and weighs the signals into a score.
fn fuse_signals(candidates: &mut [Candidate], has_query_vector: bool, weights: Weights) {
    let max_bm25 = candidates
        .iter()
        .map(|c| c.parts.bm25)
        .fold(0.0f32, f32::max);
    // Cosines cluster in a narrow band: spread them over 0..1 across this query's candidates.
    let (min_dense, max_dense) = candidates
        .iter()
        .map(|c| c.parts.dense)
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), d| {
            (lo.min(d), hi.max(d))
        });
    let dense_span = max_dense - min_dense;
    for candidate in candidates.iter_mut() {
        let bm25 = if max_bm25 > 0.0 {
            candidate.parts.bm25 / max_bm25
        } else {
            0.0
        };
        let dense = if has_query_vector && dense_span > 1e-6 {
            (candidate.parts.dense - min_dense) / dense_span
        } else {
            0.0
        };
        candidate.score =
            weights.bm25 * bm25 + weights.section * candidate.parts.section + weights.dense * dense;
    }
}

/// Cosine of the query to a chunk's vector, pooled from the stored vectors of the sentences the
/// chunk covers (weighted by how much of each it covers): no model pass at query time.
struct DenseScorer<'q> {
    query: Option<&'q [f32]>,
    vectors: Option<QuantizedVectors>,
    sentences: Vec<std::ops::Range<u32>>,
    weights: Vec<f32>,
    pooled: Vec<f32>,
}

impl<'q> DenseScorer<'q> {
    fn new(query: Option<&'q [f32]>) -> Self {
        Self {
            query,
            vectors: None,
            sentences: Vec::new(),
            weights: Vec::new(),
            pooled: Vec::new(),
        }
    }

    fn enter_section(&mut self, hit: &SectionHit) {
        self.vectors = None;
        let Some(query) = self.query else { return };
        if hit.sentence_vectors.is_empty() {
            return;
        }
        let Ok(vectors) = QuantizedVectors::from_bytes(&hit.sentence_vectors) else {
            return;
        };
        if vectors.dim() != query.len() || vectors.len() != hit.sentences.len() {
            return;
        }
        self.pooled.resize(vectors.dim(), 0.0);
        self.sentences.clone_from(&hit.sentences);
        self.vectors = Some(vectors);
    }

    fn similarity(&mut self, start: u32, end: u32) -> f32 {
        let Some(query) = self.query else {
            return 0.0;
        };
        self.pooled(start, end)
            .map_or(0.0, |pooled| crate::embed::dot(pooled, query))
    }

    /// The chunk's vector: the L2-normalised mean of the vectors of the sentences it covers.
    fn pooled(&mut self, start: u32, end: u32) -> Option<&[f32]> {
        let vectors = self.vectors.as_ref()?;
        let first = self.sentences.partition_point(|s| s.end <= start);
        let last = self.sentences.partition_point(|s| s.start < end);
        if first >= last {
            return None;
        }
        self.weights.clear();
        self.weights.extend(
            self.sentences[first..last]
                .iter()
                .map(|s| (s.end.min(end).saturating_sub(s.start.max(start))) as f32),
        );
        vectors
            .pool_into(first..last, &self.weights, &mut self.pooled)
            .ok()?;
        Some(&self.pooled)
    }
}

/// The pooled vector of each of the first `count` candidates (none without a query vector or
/// stored sentence vectors): what the diversify stage compares chunks with.
pub fn chunk_vectors(
    candidates: &[Candidate],
    count: usize,
    hits: &[SectionHit],
    query_vector: Option<&[f32]>,
) -> Vec<Option<Vec<f32>>> {
    let count = count.min(candidates.len());
    let mut vectors = vec![None; count];
    if query_vector.is_none() {
        return vectors;
    }
    // Candidates are in score order: visit them section by section so each section's vectors
    // are read once.
    let mut by_section: Vec<usize> = (0..count).collect();
    by_section.sort_by_key(|&i| candidates[i].hit_index);
    let mut dense = DenseScorer::new(query_vector);
    let mut current_section = u32::MAX;
    for i in by_section {
        let candidate = &candidates[i];
        if candidate.hit_index != current_section {
            current_section = candidate.hit_index;
            dense.enter_section(&hits[current_section as usize]);
        }
        vectors[i] = dense
            .pooled(candidate.start, candidate.end)
            .map(<[f32]>::to_vec);
    }
    vectors
}

/// Analysed tokens inside each candidate: its length for BM25's length normalisation.
fn chunk_lengths(candidates: &[Candidate], analyses: &[Arc<SectionAnalysis>]) -> Vec<u32> {
    candidates
        .iter()
        .map(|candidate| {
            let terms = &analyses[candidate.hit_index as usize].terms;
            let first = terms.partition_point(|&(offset, _)| offset < candidate.start);
            let last = terms.partition_point(|&(offset, _)| offset < candidate.end);
            (last - first) as u32
        })
        .collect()
}

fn query_matches(analysis: &SectionAnalysis, query: &QueryTerms, out: &mut Vec<(u32, u16)>) {
    out.clear();
    for &(offset, hash) in &analysis.terms {
        if let Some(index) = query.hashes.iter().position(|&h| h == hash) {
            out.push((offset, index as u16));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Strategy;
    use crate::query::{term_hash, test_section_hit as hit};
    use crate::tokens::TokenOffsets;
    use crate::types::ScoreParts;

    const WEIGHTS: Weights = Weights {
        bm25: 1.0,
        section: 0.5,
        dense: 1.0,
    };

    fn analysis(text: &str) -> Arc<SectionAnalysis> {
        let mut analyzer = crate::index::schema::analyzer();
        let mut stream = analyzer.token_stream(text);
        let mut terms = Vec::new();
        while stream.advance() {
            terms.push((
                stream.token().offset_from as u32,
                term_hash(&stream.token().text),
            ));
        }
        Arc::new(SectionAnalysis {
            tokens: TokenOffsets::default(),
            terms,
            sentences: Vec::new(),
            spans_from_offsets: false,
        })
    }

    fn candidate(section: u32, start: u32, end: u32) -> Candidate {
        Candidate {
            hit_index: section,
            start,
            end,
            token_count: 0,
            header: None,
            strategy: Strategy::Fixed,
            score: 0.0,
            parts: ScoreParts::default(),
        }
    }

    #[test]
    fn the_chunk_holding_the_query_terms_ranks_first() {
        let text = "Cats sleep a lot. The quarterly revenue grew twelve percent. Dogs bark.";
        let hits = vec![hit(1.0, text)];
        let analyses = vec![analysis(text)];
        let mut candidates = vec![
            candidate(0, 0, 17),
            candidate(0, 18, 59),
            candidate(0, 60, 71),
        ];
        let query = QueryTerms {
            hashes: vec![term_hash("revenu"), term_hash("grew")],
        };
        score(&mut candidates, &hits, &analyses, &query, None, WEIGHTS);
        assert_eq!((candidates[0].start, candidates[0].end), (18, 59));
        assert!(candidates[0].parts.bm25 > 0.0);
        assert_eq!(candidates[1].parts.bm25, 0.0);
        assert!(
            (candidates[0].score - 1.5).abs() < 1e-6,
            "normalised bm25 1 + 0.5 × section 1"
        );
    }

    #[test]
    fn a_better_section_lifts_its_chunks_when_text_ties() {
        let text = "alpha beta";
        let hits = vec![hit(1.0, text), hit(4.0, text)];
        let analyses = vec![analysis(text), analysis(text)];
        let mut candidates = vec![candidate(0, 0, 10), candidate(1, 0, 10)];
        let query = QueryTerms {
            hashes: vec![term_hash("alpha")],
        };
        score(&mut candidates, &hits, &analyses, &query, None, WEIGHTS);
        assert_eq!(candidates[0].hit_index, 1);
        assert!((candidates[1].parts.section - 0.25).abs() < 1e-6);
    }

    #[test]
    fn a_term_most_candidates_hold_weighs_less_than_a_term_one_holds() {
        // `bowl` brought these chunks here; only one says anything about pylons. With one idf
        // for both terms the chunk repeating `bowl` would rank first.
        let text = "Bowl bowl bowl bowl games bowl. The pylon cameras were new. Bowl tickets sold.";
        let hits = vec![hit(1.0, text)];
        let analyses = vec![analysis(text)];
        let mut candidates = vec![
            candidate(0, 0, 31),
            candidate(0, 32, 59),
            candidate(0, 60, 78),
        ];
        let query = QueryTerms {
            hashes: vec![term_hash("bowl"), term_hash("pylon")],
        };
        score(&mut candidates, &hits, &analyses, &query, None, WEIGHTS);
        assert_eq!((candidates[0].start, candidates[0].end), (32, 59));

        // The idf itself: N = 3 candidates; `bowl` in all 3, `pylon` in 1, a third term in none.
        let frequencies = [3, 0, 0, 1, 1, 0, 1, 0, 0];
        let idf = candidate_idf(&frequencies, 3);
        let expected = |n: f32| (1.0 + (3.0 - n + 0.5) / (n + 0.5)).ln();
        for (got, n) in idf.iter().zip([3.0, 1.0, 0.0]) {
            assert!((got - expected(n)).abs() < 1e-6, "{idf:?}");
        }
        assert!(idf[0] < idf[1] && idf[1] < idf[2]);
    }

    /// The JSON log lines `trace_candidates` writes under a subscriber at `level`.
    fn traced_lines(
        level: tracing::Level,
        candidates: &[Candidate],
        hits: &[SectionHit],
    ) -> Vec<serde_json::Value> {
        let ((), log) = crate::test_log::logged_while(level, || {
            trace_candidates("the query", 64, false, candidates, hits)
        });
        log.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn traced_candidates_hold_their_document_ranges_in_pack_order_and_only_when_asked_for() {
        // Two sections of one document: the second starts after the blank line.
        let document = "Cats sleep a lot. Dogs bark at night.\n\nThe quarterly revenue grew.";
        let second = document.find("The").unwrap();
        let hits = vec![hit(1.0, &document[..37]), {
            let mut later = hit(2.0, &document[second..]);
            later.byte_start = second as u64;
            later
        }];
        let analyses = vec![analysis(&hits[0].text), analysis(&hits[1].text)];
        let mut candidates = vec![
            candidate(0, 0, 17),
            candidate(0, 18, 37),
            candidate(1, 0, 27),
        ];
        let query = QueryTerms {
            hashes: vec![term_hash("revenu")],
        };
        score(&mut candidates, &hits, &analyses, &query, None, WEIGHTS);

        let lines = traced_lines(tracing::Level::TRACE, &candidates, &hits);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let fields = &lines[0]["fields"];
        assert_eq!(lines[0]["target"], CANDIDATES_TARGET);
        assert_eq!(fields["query"], "the query");
        assert_eq!(fields["budget"], 64);
        let traced: Vec<serde_json::Value> =
            serde_json::from_str(fields["candidates"].as_str().unwrap()).unwrap();
        assert_eq!(traced.len(), candidates.len());
        for (traced, candidate) in traced.iter().zip(&candidates) {
            let hit = &hits[candidate.hit_index as usize];
            let (start, end) = (
                traced["start"].as_u64().unwrap() as usize,
                traced["end"].as_u64().unwrap() as usize,
            );
            assert_eq!(
                &document[start..end],
                &hit.text[candidate.start as usize..candidate.end as usize],
                "a traced range is the chunk's range in its document"
            );
            assert_eq!(traced["section_rank"], candidate.hit_index);
            assert_eq!(traced["score"].as_f64().unwrap() as f32, candidate.score);
            assert_eq!(
                traced["bm25"].as_f64().unwrap() as f32,
                candidate.parts.bm25
            );
        }
        assert_eq!(traced[0]["start"], second, "best first: the revenue chunk");

        assert!(
            traced_lines(tracing::Level::DEBUG, &candidates, &hits).is_empty(),
            "nothing is written below trace level"
        );
    }
}
