//! Retrieve: the stages of the query pipeline run in order on the CPU pool, each timed under its
//! stage's name; whole answers are cached per index generation.

use std::sync::Arc;
use std::time::Instant;

use super::cache::{Caches, ResultKey};
use super::{Collection, Engine};
use crate::chunk::ChunkOptions;
use crate::embed::Embedder;
use crate::error::Result;
use crate::index::{CollectionIndex, SectionHit, Snapshot};
use crate::query::context::SpanContexts;
use crate::query::diversify::{self, MMR_POOL};
use crate::query::{
    analyze, assemble, coarse, embed, expand, join, pack, rechunk, score, validate, Candidate,
    FitInputs, SectionAnalysis,
};
use crate::tokenizer::BudgetTokenizer;
use crate::types::{RetrieveQuery, RetrieveResult, RetrievedChunk};

/// Fixed for the life of the engine: how signals are weighed, and the query embedder.
struct QuerySettings {
    weights: score::Weights,
    /// MMR for a request that leaves `diversity` unset and whose query is ambiguous.
    ambiguous: AmbiguousQueries,
    fusion: coarse::Fusion,
    embedder: Option<Arc<dyn Embedder>>,
    /// The embedder's name in the query-vector cache's keys.
    model_name: &'static str,
}

impl Engine {
    /// Answers `query`; with a non-zero `consistency_token` (replication), only once this
    /// replica has applied the log up to it.
    pub async fn retrieve(
        &self,
        query: RetrieveQuery,
        consistency_token: u64,
    ) -> Result<RetrieveResult> {
        let started = Instant::now();
        validate::validate_query(&self.config.limits, &query)?;
        self.wait_for_token(consistency_token).await?;
        let collection = self
            .collection_or_log(&query.collection)
            .await
            .map_err(|error| error.naming_documents(&query.filter.doc_ids))?;
        let options = validate::resolve_chunking(
            &query.chunking,
            &collection.extra.default_chunking,
            query.token_budget,
            self.config.retrieval.default_chunk_tokens,
            &self.config.limits,
        )?;
        let sizes = validate::chunk_sizes(
            &query.chunking,
            &collection.extra.default_chunking,
            &options,
            query.token_budget,
            self.config.retrieval.default_chunk_tokens,
        );
        let top_k = validate::resolve_top_k(
            query.top_k,
            query.token_budget,
            collection.settings.section_tokens,
            &self.config.limits,
            self.config.retrieval.default_top_k,
        );
        let dense_watch = DenseStateWatch::start(&collection.index);
        // Read before the snapshot: everything applied up to it is in the snapshot.
        let log_position = self.applied_position();
        let snapshot = collection.index.snapshot();
        let key = ResultKey {
            incarnation: collection.extra.incarnation,
            generation: snapshot.generation,
            query,
        };
        if let Some(cached) = self.caches.results.get(&key) {
            self.record_result_lookup(true);
            let mut result = (*cached).clone();
            result.cache_hit = true;
            result.log_position = log_position;
            result.timings = vec![
                ("cache", started.elapsed().as_micros() as u64),
                ("total", started.elapsed().as_micros() as u64),
            ];
            return Ok(result);
        }
        self.record_result_lookup(false);
        let settings = self.query_settings();
        let caches = self.caches.clone();
        let stages_key = key.clone();
        let stages_collection = Arc::clone(&collection);
        let mut result = self
            .pool
            .run(move || {
                let query = &stages_key.query;
                let plan = QueryPlan {
                    query,
                    options: &options,
                    sizes: &sizes,
                    top_k,
                };
                run_query_stages(&stages_collection, &snapshot, &plan, &settings, &caches)
            })
            .await?;
        result.generation = key.generation;
        result.log_position = log_position;
        result
            .timings
            .push(("total", started.elapsed().as_micros() as u64));
        self.record_query_metrics(&result);
        // An answer computed while a commit was changing the dense index may differ from one
        // computed at its generation later: it is returned, but not cached.
        if dense_watch.held_one_state(&collection.index) {
            self.caches.results.insert(key, Arc::new(result.clone()));
        }
        Ok(result)
    }

    fn query_settings(&self) -> QuerySettings {
        let retrieval = &self.config.retrieval;
        QuerySettings {
            weights: score::Weights {
                bm25: retrieval.bm25_weight,
                section: retrieval.section_weight,
                dense: retrieval.dense_weight,
            },
            ambiguous: AmbiguousQueries {
                diversity: retrieval.ambiguous_diversity,
                gap: retrieval.ambiguous_gap,
            },
            fusion: coarse::Fusion {
                k: retrieval.rrf_k,
                lexical_weight: retrieval.rrf_lexical_weight,
                dense_weight: retrieval.rrf_dense_weight,
            },
            embedder: self.embedder.clone(),
            model_name: self.config.models.dense.name(),
        }
    }
}

/// Whether the dense index stayed in one state while a query ran. Its change counter is odd while
/// a commit changes it and moves with every change; it is read before the snapshot is taken.
struct DenseStateWatch {
    changes_at_start: u64,
}

impl DenseStateWatch {
    fn start(index: &CollectionIndex) -> Self {
        Self {
            changes_at_start: Self::changes(index),
        }
    }

    fn held_one_state(&self, index: &CollectionIndex) -> bool {
        self.changes_at_start.is_multiple_of(2) && Self::changes(index) == self.changes_at_start
    }

    /// The one read of the index's change counter.
    fn changes(index: &CollectionIndex) -> u64 {
        index.commit_seqlock()
    }
}

/// The query with what the validate stage resolved for it.
struct QueryPlan<'a> {
    query: &'a RetrieveQuery,
    options: &'a ChunkOptions,
    /// The chunk sizes the sections are cut at (`validate::chunk_sizes`).
    sizes: &'a [u32],
    /// The coarse depth: the request's `top_k`, else the budget's.
    top_k: u32,
}

/// Runs the query stages in order (see [`crate::query`]), timing each under its own name.
fn run_query_stages(
    collection: &Collection,
    snapshot: &Snapshot,
    plan: &QueryPlan,
    settings: &QuerySettings,
    caches: &Caches,
) -> Result<RetrieveResult> {
    let QueryPlan {
        query,
        options,
        sizes,
        top_k,
    } = *plan;
    let mut timer = StageTimer::start();
    let index = &collection.index;
    let tokenizer = &collection.extra.tokenizer;

    let model = settings
        .embedder
        .as_deref()
        .map(|embedder| embed::QueryModel {
            embedder,
            name: settings.model_name,
        });
    let vectors = &caches.query_vectors;
    let (embedded, vector_source) = embed::embed(&query.query, model, vectors, index)?;
    timer.lap("embed");

    let query_vector = embedded.vector.as_deref();
    let (filter, top_k) = (&query.filter, top_k as usize);
    let hits = coarse::retrieve(
        index,
        snapshot,
        &embedded.terms,
        query_vector,
        filter,
        top_k,
        settings.fusion,
    )?;
    timer.lap("coarse");

    let (analyses, section_cache_misses) = analyze::analyze(&hits, tokenizer, &caches.sections);
    timer.lap("analyze");

    let semantic_threshold = validate::semantic_threshold(&query.chunking);
    let mut candidates = rechunk::rechunk(&hits, &analyses, options, sizes, semantic_threshold);
    timer.lap("rechunk");

    let scoring_terms = &embedded.scoring_terms;
    score::score(
        &mut candidates,
        &hits,
        &analyses,
        scoring_terms,
        query_vector,
        settings.weights,
    );
    timer.lap("score");

    let diversified = diversify_if_asked(query, &mut candidates, &hits, query_vector, settings);
    if diversified {
        timer.lap("diversify");
    }
    score::trace_candidates(
        &query.query,
        query.token_budget,
        diversified,
        &candidates,
        &hits,
    );

    let chunks = fit_budget(query, &candidates, &hits, &analyses, tokenizer, &mut timer);

    Ok(RetrieveResult {
        tokens_used: chunks.iter().map(|c| c.token_count).sum(),
        token_budget: query.token_budget,
        generation: snapshot.generation,
        cache_hit: false,
        timings: timer.timings,
        sections_considered: hits.len() as u32,
        section_cache_misses,
        chunks_considered: candidates.len() as u32,
        chunks,
        log_position: 0,
        query_vector: vector_source,
    })
}

/// The last stages: pack the best chunks into the token budget, grow them into what is left,
/// read the spans of neighbouring sections as one where only whitespace lies between, and put
/// them in the asked order.
fn fit_budget(
    query: &RetrieveQuery,
    candidates: &[Candidate],
    hits: &[SectionHit],
    analyses: &[Arc<SectionAnalysis>],
    tokenizer: &BudgetTokenizer,
    timer: &mut StageTimer,
) -> Vec<RetrievedChunk> {
    let budget = query.token_budget;
    let selection = &query.selection;
    let contexts = SpanContexts::for_order(query.order, hits, tokenizer);
    let mut spans = pack::pack(
        candidates, hits, analyses, budget, tokenizer, selection, &contexts,
    );
    timer.lap("pack");

    let fit = FitInputs {
        hits,
        analyses,
        budget,
        tokenizer,
        contexts: &contexts,
    };
    expand::expand(&mut spans, &fit);
    timer.lap("expand");

    let mut passages = join::join(&mut spans, &fit);
    timer.lap("join");

    let chunks = assemble::assemble(&spans, &mut passages, hits, query.order, &contexts);
    timer.lap("assemble");
    chunks
}

/// Each stage's time in microseconds, under its name, in the order they ran.
struct StageTimer {
    timings: Vec<(&'static str, u64)>,
    clock: Instant,
}

impl StageTimer {
    fn start() -> Self {
        Self {
            timings: Vec::with_capacity(8),
            clock: Instant::now(),
        }
    }

    /// Records the time since the previous lap (or the start) as `stage`'s.
    fn lap(&mut self, stage: &'static str) {
        self.timings
            .push((stage, self.clock.elapsed().as_micros() as u64));
        self.clock = Instant::now();
    }
}

/// `retrieval.ambiguous_diversity` and `retrieval.ambiguous_gap`.
#[derive(Clone, Copy)]
struct AmbiguousQueries {
    diversity: f32,
    /// A share of the chunk score's range.
    gap: f32,
}

/// Reorders the candidates by MMR when the query sets a diversity, or leaves it unset and is
/// ambiguous ([`diversify::is_ambiguous`]); true when it did.
fn diversify_if_asked(
    query: &RetrieveQuery,
    candidates: &mut [Candidate],
    hits: &[SectionHit],
    query_vector: Option<&[f32]>,
    settings: &QuerySettings,
) -> bool {
    let diversity = match query.selection.diversity {
        Some(asked) => asked.0,
        None => {
            let ambiguous = settings.ambiguous;
            let gap = ambiguous.gap * settings.weights.score_range(query_vector.is_some());
            if ambiguous.diversity > 0.0 && diversify::is_ambiguous(candidates, hits, gap) {
                ambiguous.diversity
            } else {
                0.0
            }
        }
    };
    if diversity <= 0.0 {
        return false;
    }
    let vectors = score::chunk_vectors(candidates, MMR_POOL, hits, query_vector);
    diversify::diversify(candidates, &vectors, hits, diversity, query.token_budget);
    true
}
