//! Criterion benchmarks of the query-time stages on real squad-a sections.
//!
//! What it measures: the library functions the service runs per query, on the workload of 16
//! squad-a questions (every 300th of queries.jsonl), each with 8 retrieved sections: the gold
//! paragraph and the 7 paragraphs after it in its article (wrapping), i.e. what a top-8 coarse
//! search returns when it finds the right place. One iteration processes all 16 queries:
//! - `analyze/cold`: budget-token offsets (MiniLM tokenizer) and BM25 term positions of the 8
//!   sections, each with its sentences as stored at ingest, with an empty section cache (what a
//!   never-seen section costs);
//! - `analyze/section_cache_hit`: the same with every section already cached;
//! - `rechunk/<strategy>-<max>`: cutting the 8 sections into candidate chunks;
//! - `score`: chunk BM25 + section prior, sorted;
//! - `pack/<budget>`: greedy packing plus the exact recount with the budget tokenizer;
//! - `result_cache_hit`: the result-cache lookup and clone of a whole answer (budget 512), the
//!   work of a repeated request before the gRPC encoding.
//!
//! Run: `cargo bench --bench stages` (needs ./models, see scripts/fetch-models.sh, and the dataset
//! at ../shared/eval/squad-a; override with LATHE_MODELS_DIR and LATHE_SQUAD_DIR).
//! Quick run: `cargo bench --bench stages -- --warm-up-time 1 --measurement-time 3`.

mod common;

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use lathe::chunk::{ChunkOptions, Strategy, Unit};
use lathe::index::SectionHit;
use lathe::query::analyze::analyze;
use lathe::query::context::SpanContexts;
use lathe::query::pack::pack;
use lathe::query::rechunk::rechunk;
use lathe::query::score::{score, Weights};
use lathe::query::{term_hash, Candidate, PackedSpan, QueryTerms, SectionAnalysis};
use lathe::service::cache::{Caches, ResultKey};
use lathe::tokenizer::BudgetTokenizer;
use lathe::types::{
    ChunkSelection, ChunkingSpec, Filter, ResultOrder, RetrieveQuery, RetrieveResult,
    RetrievedChunk,
};
use lathe_tools::eval::Dataset;

use common::{manifest_path, section_texts, squad_dir};

const QUERIES: usize = 16;
const SECTIONS_PER_QUERY: usize = 8;
const WEIGHTS: Weights = Weights {
    bm25: 1.0,
    section: 0.5,
    dense: 1.0,
};

struct Workload {
    tokenizer: BudgetTokenizer,
    /// Per query: its hits, analyses and analysed terms.
    queries: Vec<(Vec<SectionHit>, QueryTerms)>,
}

fn analysed_terms(text: &str) -> Vec<u64> {
    let mut analyzer = lathe::index::schema::analyzer();
    let mut stream = analyzer.token_stream(text);
    let mut terms = Vec::new();
    while stream.advance() {
        terms.push(term_hash(&stream.token().text));
    }
    terms
}

fn load() -> Workload {
    let models = manifest_path("LATHE_MODELS_DIR", "models");
    let squad = squad_dir();
    let tokenizer =
        BudgetTokenizer::resolve("minilm", &models).expect("MiniLM tokenizer in models/");
    let dataset = Dataset::load(&squad).expect("squad-a dataset");

    // Paragraph texts (chunk BM25 takes its idf over each query's candidates).
    let mut paragraphs: Vec<Vec<String>> = Vec::new();
    for document in &dataset.documents {
        let texts: Vec<String> = section_texts(document)
            .into_iter()
            .map(|(_, text)| text)
            .collect();
        paragraphs.push(texts);
    }

    let mut queries = Vec::new();
    for query in dataset.queries.iter().step_by(300).take(QUERIES) {
        let doc_index = dataset.document_index[&query.doc_id];
        let texts = &paragraphs[doc_index];
        let first = query.gold_sections.first().copied().unwrap_or(0);
        let hits: Vec<SectionHit> = (0..SECTIONS_PER_QUERY)
            .map(|i| {
                let ordinal = (first + i) % texts.len();
                // Stored with each section at ingest, as the sentences stage computes them.
                let mut sentences = Vec::new();
                lathe::chunk::sentences(&texts[ordinal], &mut sentences);
                SectionHit {
                    score: 10.0 - i as f32,
                    doc_id: query.doc_id.clone(),
                    ordinal: ordinal as u64,
                    version: 0,
                    doc_title: String::new(),
                    heading_path: Vec::new(),
                    text: texts[ordinal].clone(),
                    gap_after: String::new(),
                    byte_start: 0,
                    char_start: 0,
                    metadata: Default::default(),
                    section_key: ordinal as u64,
                    sentences,
                    sentence_vectors: Vec::new(),
                }
            })
            .collect();
        let mut hashes = analysed_terms(&query.question);
        hashes.sort_unstable();
        hashes.dedup();
        queries.push((hits, QueryTerms { hashes }));
    }
    Workload { tokenizer, queries }
}

fn options(strategy: Strategy, max_size: u32) -> ChunkOptions {
    ChunkOptions {
        strategy,
        max_size,
        overlap: 0,
        unit: Unit::Tokens,
        separators: None,
    }
}

/// Every query's section analyses (through `caches`), and its candidates cut by
/// `sentence-128` and scored: the inputs of the later stages.
fn analysed_and_scored(
    workload: &Workload,
    caches: &Caches,
    sentence_128: &ChunkOptions,
) -> (Vec<Vec<Arc<SectionAnalysis>>>, Vec<Vec<Candidate>>) {
    let analyses: Vec<Vec<Arc<SectionAnalysis>>> = workload
        .queries
        .iter()
        .map(|(hits, _)| analyze(hits, &workload.tokenizer, &caches.sections).0)
        .collect();
    let scored: Vec<Vec<Candidate>> = workload
        .queries
        .iter()
        .zip(&analyses)
        .map(|((hits, terms), analyses)| {
            let mut candidates = rechunk(hits, analyses, sentence_128, &[], Default::default());
            score(&mut candidates, hits, analyses, terms, None, WEIGHTS);
            candidates
        })
        .collect();
    (analyses, scored)
}

fn stages(c: &mut Criterion) {
    let workload = load();
    let caches = Caches::new(64 << 20, 256 << 20, 16 << 20);
    let sentence_128 = options(Strategy::Sentence, 128);
    let (analyses, scored) = analysed_and_scored(&workload, &caches, &sentence_128);

    let mut group = c.benchmark_group("stages");
    group.throughput(Throughput::Elements(QUERIES as u64));
    bench_analyze(&mut group, &workload, &caches);
    bench_rechunk(&mut group, &workload, &analyses, &sentence_128);
    bench_score(&mut group, &workload, &analyses, &sentence_128);
    bench_pack(&mut group, &workload, &analyses, &scored);
    bench_result_cache_hit(&mut group, &workload, &caches, &analyses, &scored);
    group.finish();
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// `analyze/cold` (a fresh section cache per batch) and `analyze/section_cache_hit`.
fn bench_analyze(group: &mut Group, workload: &Workload, caches: &Caches) {
    group.bench_function("analyze/cold", |b| {
        b.iter_batched(
            || Caches::new(1 << 20, 256 << 20, 16 << 20),
            |fresh| {
                for (hits, _) in &workload.queries {
                    black_box(analyze(hits, &workload.tokenizer, &fresh.sections));
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("analyze/section_cache_hit", |b| {
        b.iter(|| {
            for (hits, _) in &workload.queries {
                black_box(analyze(hits, &workload.tokenizer, &caches.sections));
            }
        })
    });
}

/// `rechunk/<strategy>-<max>` for sentence and fixed cuts of 128 and 64 tokens.
fn bench_rechunk(
    group: &mut Group,
    workload: &Workload,
    analyses: &[Vec<Arc<SectionAnalysis>>],
    sentence_128: &ChunkOptions,
) {
    for (name, chunk_options) in [
        ("rechunk/sentence-128", sentence_128.clone()),
        ("rechunk/sentence-64", options(Strategy::Sentence, 64)),
        ("rechunk/fixed-128", options(Strategy::Fixed, 128)),
        ("rechunk/fixed-64", options(Strategy::Fixed, 64)),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                for ((hits, _), analyses) in workload.queries.iter().zip(analyses) {
                    black_box(rechunk(
                        hits,
                        analyses,
                        &chunk_options,
                        &[],
                        Default::default(),
                    ));
                }
            })
        });
    }
}

/// `score/sentence-128`: scoring fresh copies of the unscored candidates.
fn bench_score(
    group: &mut Group,
    workload: &Workload,
    analyses: &[Vec<Arc<SectionAnalysis>>],
    sentence_128: &ChunkOptions,
) {
    let unscored: Vec<Vec<Candidate>> = workload
        .queries
        .iter()
        .zip(analyses)
        .map(|((hits, _), analyses)| rechunk(hits, analyses, sentence_128, &[], Default::default()))
        .collect();
    group.bench_function("score/sentence-128", |b| {
        b.iter_batched(
            || unscored.clone(),
            |mut all| {
                for (((hits, terms), analyses), candidates) in
                    workload.queries.iter().zip(analyses).zip(all.iter_mut())
                {
                    score(candidates, hits, analyses, terms, None, WEIGHTS);
                }
                all
            },
            BatchSize::SmallInput,
        )
    });
}

/// `pack/<budget>` for budgets of 128, 512 and 1024 tokens.
fn bench_pack(
    group: &mut Group,
    workload: &Workload,
    analyses: &[Vec<Arc<SectionAnalysis>>],
    scored: &[Vec<Candidate>],
) {
    for budget in [128u32, 512, 1024] {
        group.bench_function(format!("pack/{budget}"), |b| {
            b.iter(|| {
                for (((hits, _), analyses), candidates) in
                    workload.queries.iter().zip(analyses).zip(scored)
                {
                    black_box(pack(
                        candidates,
                        hits,
                        analyses,
                        budget,
                        &workload.tokenizer,
                        &ChunkSelection::default(),
                        &SpanContexts::default(),
                    ));
                }
            })
        });
    }
}

/// `result_cache_hit`: whole answers (budget 512) put in the result cache, keyed as the service
/// keys them, then looked up and cloned.
fn bench_result_cache_hit(
    group: &mut Group,
    workload: &Workload,
    caches: &Caches,
    analyses: &[Vec<Arc<SectionAnalysis>>],
    scored: &[Vec<Candidate>],
) {
    let keys: Vec<ResultKey> = workload
        .queries
        .iter()
        .enumerate()
        .zip(analyses)
        .zip(scored)
        .map(|(((i, (hits, _)), analyses), candidates)| {
            let spans = pack(
                candidates,
                hits,
                analyses,
                512,
                &workload.tokenizer,
                &ChunkSelection::default(),
                &SpanContexts::default(),
            );
            let result = RetrieveResult {
                chunks: spans
                    .iter()
                    .map(|span| retrieved_chunk(hits, span))
                    .collect(),
                tokens_used: spans.iter().map(|s| s.token_count).sum(),
                token_budget: 512,
                generation: 1,
                ..Default::default()
            };
            let key = result_key(i);
            caches.results.insert(key.clone(), Arc::new(result));
            key
        })
        .collect();
    group.bench_function("result_cache_hit", |b| {
        b.iter(|| {
            for key in &keys {
                let cached = caches.results.get(key).expect("inserted above");
                let mut result = (*cached).clone();
                result.cache_hit = true;
                black_box(result);
            }
        })
    });
}

/// The answer chunk the assemble stage makes of a packed span.
fn retrieved_chunk(hits: &[SectionHit], span: &PackedSpan) -> RetrievedChunk {
    let hit = &hits[span.hit_index as usize];
    let text = hit.text[span.start as usize..span.end as usize].to_string();
    RetrievedChunk {
        doc_id: hit.doc_id.clone(),
        section_ordinal: hit.ordinal,
        heading_path: Vec::new(),
        doc_title: hit.doc_title.clone(),
        bytes: span.start as u64..span.end as u64,
        chars: 0..text.chars().count() as u64,
        text,
        context: String::new(),
        token_count: span.token_count,
        score: span.score,
        parts: span.parts,
        strategy: span.strategy,
        metadata: Default::default(),
    }
}

/// The result-cache key of query `i` (budget 512, top 8).
fn result_key(i: usize) -> ResultKey {
    ResultKey {
        incarnation: 1,
        generation: 1,
        query: RetrieveQuery {
            collection: "squad".into(),
            query: format!("question {i}"),
            top_k: Some(8),
            token_budget: 512,
            chunking: ChunkingSpec::default(),
            filter: Filter::default(),
            order: ResultOrder::Score,
            selection: ChunkSelection::default(),
        },
    }
}

criterion_group!(benches, stages);
criterion_main!(benches);
