//! The coarse stage leg by leg, on a collection `lathe-bench --keep` built: where a query's
//! time goes before any chunk is cut.
//!
//! For each of the scale benchmark's queries (the same 1,000 distinct corpus lines `lathe-bench`
//! asks, embedded by the static model) it times, one after the other on this thread (the CPU
//! time a query costs; the server runs the two legs side by side only when its pool is idle):
//! - `lexical`: `CollectionIndex::find`, BM25 over section text and titles, top `top_k`;
//! - `dense search`: `DenseIndex::search`, every segment's graph walk, merged;
//! - `dense find`: `CollectionIndex::find_dense`, the search and the check of its keys against
//!   the snapshot (so `dense find - dense search` is that check);
//! - `fuse`: the reciprocal-rank fusion of the two legs;
//! - `read`: `CollectionIndex::read_found` of the fused `top_k`, the doc-store reads;
//! - `retrieve`: `coarse::retrieve`, the whole stage as the server calls it.
//!
//! It prints each one's median, p90 and p99 in milliseconds, and what shapes them: the query's
//! analysed terms, the tantivy segments, the dense segments and `ef`.
//!
//! Run (a collection from the "Scale" build command of BENCHMARKS.md):
//! `LATHE_COARSE_COLLECTION=DIR/size-100000/data/collections/bench LATHE_DEBIAN_DOCS=/tmp/dd
//! cargo bench --bench coarse`; `LATHE_COARSE_QUERIES` (1000), `LATHE_COARSE_BUDGET` (1024),
//! `LATHE_COARSE_EF` (the server's default `dense.ef_search`) change the workload.

mod common;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lathe::config::Config;
use lathe::embed::{Embedder, StaticEmbedder};
use lathe::index::CollectionIndex;
use lathe::query::coarse::{self, Fusion};
use lathe::query::plan::resolve_top_k;
use lathe::service::dense_index_config;
use lathe::types::Filter;
use lathe_tools::scale_corpus::{corpus_queries, load_corpus};

use common::manifest_path;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The collection's `section_tokens`, from its `collection.json`.
fn section_tokens(collection: &std::path::Path) -> u32 {
    let path = collection.join("collection.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("collection.json is JSON");
    json.get("section_tokens")
        .and_then(serde_json::Value::as_u64)
        .expect("collection.json names section_tokens") as u32
}

/// One leg's times, one per query.
struct Leg {
    name: &'static str,
    times: Vec<Duration>,
}

impl Leg {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            times: Vec::new(),
        }
    }

    fn time<T>(&mut self, work: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = work();
        self.times.push(start.elapsed());
        out
    }

    fn row(&mut self) -> String {
        self.times.sort_unstable();
        let at = |q: f64| {
            let i = ((self.times.len() as f64 * q) as usize).min(self.times.len() - 1);
            self.times[i].as_secs_f64() * 1e3
        };
        let mean =
            self.times.iter().sum::<Duration>().as_secs_f64() * 1e3 / self.times.len() as f64;
        format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            self.name,
            at(0.5),
            at(0.9),
            at(0.99),
            mean
        )
    }
}

fn main() {
    let collection = PathBuf::from(std::env::var("LATHE_COARSE_COLLECTION").expect(
        "set LATHE_COARSE_COLLECTION to a collection folder (DIR/collections/NAME) that \
         lathe-bench --keep built",
    ));
    let corpus = manifest_path("LATHE_DEBIAN_DOCS", "/tmp/dd");
    let models = manifest_path("LATHE_MODELS_DIR", "models");
    let wanted = env_or("LATHE_COARSE_QUERIES", 1000usize);
    let budget = env_or("LATHE_COARSE_BUDGET", 1024u32);
    let config = Config::default();
    let ef = env_or("LATHE_COARSE_EF", config.dense.ef_search);

    let embedder = StaticEmbedder::from_models_dir(&models).expect("the static model");
    let mut dense = dense_index_config(&config.dense, embedder.dim());
    dense.ef_search = ef;
    let opening = Instant::now();
    let index = CollectionIndex::open_or_create_with(
        &collection.join("index"),
        64 << 20,
        Duration::from_secs(3600),
        Some(dense),
    )
    .expect("open the collection");
    let opened = opening.elapsed();

    let documents = load_corpus(&corpus).expect("the scale corpus");
    let queries: Vec<(Vec<String>, Vec<f32>)> = corpus_queries(&documents, wanted)
        .iter()
        .map(|query| {
            let vector = embedder.embed_query(query).expect("embed");
            (index.query_terms(query), vector)
        })
        .collect();
    let top_k = resolve_top_k(
        None,
        budget,
        section_tokens(&collection),
        &config.limits,
        config.retrieval.default_top_k,
    ) as usize;
    let retrieval = &config.retrieval;
    let fusion = Fusion {
        k: retrieval.rrf_k,
        lexical_weight: retrieval.rrf_lexical_weight,
        dense_weight: retrieval.rrf_dense_weight,
    };
    let filter = Filter::default();
    let snapshot = index.snapshot();
    let dense = index.dense().expect("a collection with section vectors");

    let mut legs = [
        "lexical",
        "dense search",
        "dense find",
        "fuse",
        "read",
        "retrieve",
    ]
    .map(Leg::new);
    // A first pass untimed: the page cache and the section store's caches as a server has them
    // after its first queries.
    for round in 0..2 {
        for (terms, vector) in &queries {
            let lexical = legs[0].time(|| index.find(&snapshot, terms, &filter, top_k).unwrap());
            black_box(legs[1].time(|| dense.search(vector, top_k, &|_| true).unwrap()));
            let found =
                legs[2].time(|| index.find_dense(&snapshot, vector, &filter, top_k).unwrap());
            let fused = legs[3].time(|| coarse::fuse(lexical, found, top_k, fusion));
            black_box(legs[4].time(|| index.read_found(&snapshot, &fused).unwrap()));
            black_box(legs[5].time(|| {
                coarse::retrieve(
                    &index,
                    &snapshot,
                    terms,
                    Some(vector),
                    &filter,
                    top_k,
                    fusion,
                )
                .unwrap()
            }));
        }
        if round == 0 {
            legs.iter_mut().for_each(|leg| leg.times.clear());
        }
    }

    let terms: Vec<usize> = queries.iter().map(|(terms, _)| terms.len()).collect();
    let mean_terms = terms.iter().sum::<usize>() as f64 / terms.len() as f64;
    println!(
        "collection {}: {} sections in {} tantivy segments; dense segments (live vectors, \
         the live one last) {:?}; opened in {:.2} s",
        collection.display(),
        snapshot.searcher.num_docs(),
        snapshot.searcher.segment_readers().len(),
        dense.segment_sizes(),
        opened.as_secs_f64()
    );
    println!(
        "{} queries, budget {budget}: top_k {top_k}, ef {ef}, {mean_terms:.1} analysed terms a \
         query (a BM25 clause per term and field: text, title_text)\n",
        queries.len()
    );
    println!("| leg | p50 ms | p90 ms | p99 ms | mean ms |\n|---|---:|---:|---:|---:|");
    for leg in &mut legs {
        println!("{}", leg.row());
    }
    index.shutdown();
}
