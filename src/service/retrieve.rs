//! Retrieve: the stages of the query pipeline run in order on the CPU pool, each timed under its
//! stage's name; whole answers are cached per index generation.

use std::sync::Arc;
use std::time::Instant;

use super::cache::{Caches, ResultKey};
use super::{Collection, Engine};
use crate::embed::Embedder;
use crate::error::Result;
use crate::index::{CollectionIndex, SectionHit, Snapshot};
use crate::query::context::SpanContexts;
use crate::query::diversify::{self, MMR_POOL};
use crate::query::plan::{self, PlanDefaults};
use crate::query::{
    analyze, assemble, coarse, embed, expand, join, pack, rechunk, score, validate, Candidate,
    EmbeddedQuery, FitInputs, QueryPlan, SectionAnalysis,
};
use crate::types::{QueryVectorSource, RetrieveQuery, RetrieveResult, RetrievedChunk};

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
        mut query: RetrieveQuery,
        consistency_token: u64,
    ) -> Result<RetrieveResult> {
        let started = Instant::now();
        validate::validate_query(&self.config.limits, &query)?;
        // Once, here: every stage runs on this collection, whatever an alias names meanwhile.
        let target = self.resolve(&query.collection);
        self.wait_for_token(&target.collection, consistency_token)
            .await?;
        let collection = self
            .resolved_collection(&target)
            .await
            .map_err(|error| error.naming_documents(&query.filter.doc_ids))?;
        // The cache key names the collection, never the alias: a switched alias cannot hit the
        // other collection's answers (the incarnation already tells collections apart).
        query.collection.clone_from(&collection.name);
        let defaults = PlanDefaults {
            chunking: &collection.extra.default_chunking,
            section_tokens: collection.settings.section_tokens,
            limits: &self.config.limits,
            retrieval: &self.config.retrieval,
        };
        let plan = plan::plan(&query, &defaults)?;
        let dense_watch = DenseStateWatch::start(&collection.index);
        // Read before the snapshot: everything applied up to it is in the snapshot.
        let log_position = self.applied_position();
        let snapshot = collection.index.snapshot();
        let key = ResultKey {
            incarnation: collection.extra.incarnation,
            generation: snapshot.generation,
            query,
        };
        if let Some(cached) = self.cached_answer(&key, started, log_position) {
            return Ok(cached);
        }
        let settings = self.query_settings();
        let caches = self.caches.clone();
        let stages_key = key.clone();
        let stages_collection = Arc::clone(&collection);
        let mut result = self
            .pool
            .run(move || {
                let run = QueryRun {
                    collection: &stages_collection,
                    snapshot: &snapshot,
                    query: &stages_key.query,
                    plan: &plan,
                    settings: &settings,
                    caches: &caches,
                };
                run.run_stages()
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

    /// The cached answer to `key`, if any, as served from the cache now (its lookup recorded,
    /// hit or miss).
    fn cached_answer(
        &self,
        key: &ResultKey,
        started: Instant,
        log_position: u64,
    ) -> Option<RetrieveResult> {
        let Some(cached) = self.caches.results.get(key) else {
            self.record_result_lookup(false);
            return None;
        };
        self.record_result_lookup(true);
        let mut result = (*cached).clone();
        result.cache_hit = true;
        result.log_position = log_position;
        result.timings = vec![
            ("cache", started.elapsed().as_micros() as u64),
            ("total", started.elapsed().as_micros() as u64),
        ];
        Some(result)
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

/// One query's run of the stages on a snapshot: what they read.
struct QueryRun<'a> {
    collection: &'a Collection,
    snapshot: &'a Snapshot,
    query: &'a RetrieveQuery,
    plan: &'a QueryPlan,
    settings: &'a QuerySettings,
    caches: &'a Caches,
}

/// What the first stages (embed, coarse, analyze) found.
struct FoundSections {
    embedded: EmbeddedQuery,
    vector_source: QueryVectorSource,
    hits: Vec<SectionHit>,
    analyses: Vec<Arc<SectionAnalysis>>,
    section_cache_misses: u32,
}

impl QueryRun<'_> {
    /// Runs the query stages in order (see [`crate::query`]), timing each under its own name.
    fn run_stages(&self) -> Result<RetrieveResult> {
        let mut timer = StageTimer::start();
        let found = self.find_sections(&mut timer)?;
        let candidates = self.rank_chunks(&found, &mut timer);
        let chunks = self.fit_budget(&candidates, &found, &mut timer);
        let query = self.query;
        Ok(RetrieveResult {
            tokens_used: chunks.iter().map(|c| c.token_count).sum(),
            token_budget: query.token_budget,
            generation: self.snapshot.generation,
            cache_hit: false,
            timings: timer.timings,
            sections_considered: found.hits.len() as u32,
            section_cache_misses: found.section_cache_misses,
            chunks_considered: candidates.len() as u32,
            chunks,
            log_position: 0,
            query_vector: found.vector_source,
        })
    }

    /// The embed, coarse and analyze stages: the query's vector and terms, the sections they
    /// retrieve and the analysis of each.
    fn find_sections(&self, timer: &mut StageTimer) -> Result<FoundSections> {
        let (settings, query) = (self.settings, self.query);
        let index = &self.collection.index;
        let model = settings
            .embedder
            .as_deref()
            .map(|embedder| embed::QueryModel {
                embedder,
                name: settings.model_name,
            });
        let vectors = &self.caches.query_vectors;
        let (embedded, vector_source) = embed::embed(&query.query, model, vectors, index)?;
        timer.lap("embed");

        let hits = coarse::retrieve(
            index,
            self.snapshot,
            &embedded.terms,
            embedded.vector.as_deref(),
            &query.filter,
            self.plan.top_k as usize,
            settings.fusion,
        )?;
        timer.lap("coarse");

        let tokenizer = &self.collection.extra.tokenizer;
        let (analyses, section_cache_misses) =
            analyze::analyze(&hits, tokenizer, &self.caches.sections);
        timer.lap("analyze");
        Ok(FoundSections {
            embedded,
            vector_source,
            hits,
            analyses,
            section_cache_misses,
        })
    }

    /// The rechunk and score stages, then diversify when asked: the candidates in the order
    /// pack takes them.
    fn rank_chunks(&self, found: &FoundSections, timer: &mut StageTimer) -> Vec<Candidate> {
        let (plan, query) = (self.plan, self.query);
        let (hits, analyses) = (&found.hits, &found.analyses);
        let mut candidates = rechunk::rechunk(
            hits,
            analyses,
            &plan.chunking,
            &plan.sizes,
            plan.semantic_threshold,
        );
        timer.lap("rechunk");

        let query_vector = found.embedded.vector.as_deref();
        score::score(
            &mut candidates,
            hits,
            analyses,
            &found.embedded.scoring_terms,
            query_vector,
            self.settings.weights,
        );
        timer.lap("score");

        let diversified =
            diversify_if_asked(query, &mut candidates, hits, query_vector, self.settings);
        if diversified {
            timer.lap("diversify");
        }
        score::trace_candidates(
            &query.query,
            query.token_budget,
            diversified,
            &candidates,
            hits,
        );
        candidates
    }

    /// The last stages: pack the best chunks into the token budget, grow them into what is
    /// left, read the spans of neighbouring sections as one where only whitespace lies between,
    /// and put them in the asked order.
    fn fit_budget(
        &self,
        candidates: &[Candidate],
        found: &FoundSections,
        timer: &mut StageTimer,
    ) -> Vec<RetrievedChunk> {
        let query = self.query;
        let (hits, analyses) = (&found.hits, &found.analyses);
        let tokenizer = &self.collection.extra.tokenizer;
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
